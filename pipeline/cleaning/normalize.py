"""Rewriting steps: Unicode NFC, mojibake repair, control characters, whitespace.

Each is a pure ``str -> str`` function with a cheap early exit for the common case (ASCII or
already-normal text), because cleaning must cost little next to tokenizing.
"""

from __future__ import annotations

import re
import unicodedata

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_ASCII_WS_SIGNS = ("  ", "\t", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", " \n",
                   "\n ", "\n\n\n")
_BLANK_RUNS = re.compile(r"\n{3,}")
# A lead byte of a UTF-8 sequence read as Latin-1/cp1252, followed by a continuation byte read
# the same way: the fingerprint of mojibake, found at C speed before ftfy is asked.
_MOJIBAKE_HINT = re.compile(
    "[\u00c2-\u00f4][\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192"
    "\u02c6\u02dc\u2013\u2014\u2018-\u201e\u2020-\u2022\u2026\u2030\u2039\u203a"
    "\u20ac\u2122]")

try:  # ftfy is pure Python; without it mojibake repair is skipped (and says so in the config)
    import ftfy
    from ftfy.badness import is_bad as _is_bad

    _FTFY_CONFIG = ftfy.TextFixerConfig(
        unescape_html=False, remove_terminal_escapes=False, fix_latin_ligatures=False,
        fix_character_width=False, uncurl_quotes=False, fix_line_breaks=False,
        remove_control_chars=False, normalization=None, explain=False)
    HAVE_FTFY = True
except ImportError:  # pragma: no cover - ftfy is a dependency
    HAVE_FTFY = False


def normalize_unicode(text: str) -> str:
    """NFC, so that the same visible text always maps to the same code points and tokens."""
    if text.isascii() or unicodedata.is_normalized("NFC", text):
        return text
    return unicodedata.normalize("NFC", text)


def fix_mojibake(text: str) -> str:
    """Repair UTF-8 that was decoded as Latin-1/cp1252 ("cafÃ©" → "café") with ftfy.

    Only ftfy's encoding fixes run (quotes, ligatures and widths are left alone), and only on
    text that ftfy's badness heuristic flags, so clean text costs one regex scan.
    """
    if (not HAVE_FTFY or text.isascii() or not _MOJIBAKE_HINT.search(text)
            or not _is_bad(text)):
        return text
    return ftfy.fix_text(text, _FTFY_CONFIG)


def strip_control(text: str) -> str:
    """Drop C0/C1 control characters except newline (tab becomes a space below)."""
    return _CONTROL.sub("", text.replace("\t", " "))


def collapse_whitespace(text: str) -> str:
    """One space between words, no trailing spaces, at most one blank line in a row.

    Newlines are kept: in verse, and in most prose, line structure carries meaning.
    """
    if text.isascii() and not any(s in text for s in _ASCII_WS_SIGNS) and not (
            text[:1].isspace() or text[-1:].isspace()):
        return text  # the common case, decided by a few C-speed substring scans
    text = "\n".join([" ".join(line.split()) for line in text.split("\n")])
    if "\n\n\n" in text:
        text = _BLANK_RUNS.sub("\n\n", text)
    return text.strip()
