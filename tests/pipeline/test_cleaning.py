import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from pipeline.cleaning import Cleaner, collapse_whitespace, normalize_unicode, strip_control


def test_nfc_composes_accents() -> None:
    assert normalize_unicode("Cafe\u0301") == "Caf\u00e9"


def test_control_characters_removed_newlines_kept() -> None:
    assert strip_control("a\x07b\nc\x00d\x9f") == "ab\ncd"
    assert strip_control("a\tb") == "a b"


def test_whitespace_collapsed_per_line() -> None:
    assert collapse_whitespace("  a   b \n\n\n\n c\u00a0 d  ") == "a b\n\nc d"


def test_cleaner_drops_and_counts_empty_documents() -> None:
    clean = Cleaner()
    assert clean("\x01\x02 \n ") is None
    assert clean("ok") == "ok"
    assert clean.dropped["empty"] == 1
    assert clean.kept == 1


@given(st.text())
def test_cleaning_is_idempotent_and_leaves_no_controls(text: str) -> None:
    once = Cleaner()(text)
    if once is None:
        return
    assert Cleaner()(once) == once
    assert unicodedata.is_normalized("NFC", once)
    assert not any(unicodedata.category(c) == "Cc" and c != "\n" for c in once)
    assert "  " not in once and not once.startswith((" ", "\n")) and not once.endswith(" ")

