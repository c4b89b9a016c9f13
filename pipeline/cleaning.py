"""Text cleaning: small steps, each counting what it changed or dropped and why."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_HSPACE = re.compile(r"[^\S\n]+")
_BLANK_RUNS = re.compile(r"\n{3,}")


def normalize_unicode(text: str) -> str:
    """NFC, so that the same visible text always maps to the same code points and tokens."""
    return unicodedata.normalize("NFC", text)


def strip_control(text: str) -> str:
    """Drop C0/C1 control characters except newline (tab becomes a space below)."""
    return _CONTROL.sub("", text.replace("\t", " "))


def collapse_whitespace(text: str) -> str:
    """One space between words, no trailing spaces, at most one blank line in a row.

    Newlines are kept: in verse, and in most prose, line structure carries meaning.
    """
    lines = [_HSPACE.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()


class Cleaner:
    """Apply the cleaning steps to documents and keep the counts for the summary."""

    def __init__(self) -> None:
        self.kept = 0
        self.dropped: Counter[str] = Counter()
        self.changed: Counter[str] = Counter()

    def __call__(self, text: str) -> str | None:
        """The cleaned text, or ``None`` when the document is dropped (reason counted)."""
        for name, step in (("nfc", normalize_unicode), ("control", strip_control),
                           ("whitespace", collapse_whitespace)):
            new = step(text)
            if new != text:
                self.changed[name] += 1
            text = new
        if not text:
            self.dropped["empty"] += 1
            return None
        self.kept += 1
        return text
