"""Word and sentence splitting (pure): what spaCy's English tokenizer gives on forms that
matter to the rules, and properties on any text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.web.words import ends_terminal, is_symbol_word, sentence_count, words


def test_known_forms() -> None:
    assert words("Hello, world! It's Mr. Smith's (big) day...") == \
        ["Hello", ",", "world", "!", "It", "'s", "Mr.", "Smith", "'s", "(", "big", ")",
         "day", "..."]
    assert words("I don't know; cannot say. Wed at 10am") == \
        ["I", "do", "n't", "know", ";", "can", "not", "say", ".", "We", "d", "at", "10", "am"]
    assert words("see https://example.org/a-b, or e.g. well-known x86-64 (=") == \
        ["see", "https://example.org/a-b", ",", "or", "e.g.", "well", "-", "known", "x86",
         "-", "64", "(="]
    assert words("costs $5 and 20% of 3km") == \
        ["costs", "$", "5", "and", "20", "%", "of", "3", "km"]


def test_sentences_follow_the_sentencizer() -> None:
    assert sentence_count(words("One. Two! Three? \"Four.\" Five")) == 5
    assert sentence_count(words("e.g. this is one sentence")) == 1
    assert sentence_count([]) == 0


def test_terminal_and_symbols() -> None:
    assert ends_terminal("Done.") and ends_terminal("終わり。") and not ends_terminal("no")
    assert is_symbol_word("...") and is_symbol_word("#") and not is_symbol_word("a.")


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_words_cover_the_text_exactly(text: str) -> None:
    """Tokens never lose, add or reorder characters: they concatenate to the text without
    its whitespace, and none is empty or holds whitespace."""
    toks = words(text)
    assert "".join(toks) == "".join(text.split())
    assert all(t and not any(c.isspace() for c in t) for t in toks)


@given(st.lists(st.sampled_from(["word", ".", "!", "?", "\"", "Mr.", "x"]), max_size=30))
def test_sentence_count_is_bounded(tokens: list[str]) -> None:
    n = sentence_count(tokens)
    assert (n == 0) == (not tokens)
    assert n <= 1 + sum(t in ".!?" for t in tokens)
