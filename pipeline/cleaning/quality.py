"""Quality measures for filtering: share of letters, share of repeated lines.

Computed with C-speed primitives (regex, ``set``) rather than per-character Python loops.
"""

from __future__ import annotations

import re
import string

_NOT_LETTER = re.compile(r"[\W\d_]+")
_SPACE = re.compile(r"\s+")
_ASCII_NOT_LETTER = bytes(b for b in range(128) if chr(b) not in string.ascii_letters)
_ASCII_SPACE = string.whitespace.encode() + b"\x1c\x1d\x1e\x1f"


def alpha_fraction(text: str) -> float:
    """Letters over non-whitespace characters (1.0 for text without any)."""
    if text.isascii():  # bytes.translate deletes at memory speed
        data = text.encode("ascii")
        visible = len(data.translate(None, _ASCII_SPACE))
        return len(data.translate(None, _ASCII_NOT_LETTER)) / visible if visible else 1.0
    visible = len(_SPACE.sub("", text))
    if visible <= 0:
        return 1.0
    return len(_NOT_LETTER.sub("", text)) / visible


def repeated_line_fraction(text: str) -> float:
    """Share of non-empty lines that repeat an earlier line (boilerplate, menus, spam)."""
    lines = [line for line in text.split("\n") if line]
    if len(lines) < 2:
        return 0.0
    return 1.0 - len(set(lines)) / len(lines)
