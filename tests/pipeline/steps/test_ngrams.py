"""The n-gram logic of decontamination, property-tested: the normalisation ignores case,
punctuation, accents and spacing; the vectorised hashes are the word-by-word reference; the
index finds exactly the n-grams a document shares with the eval sets (checked against the
sets of word tuples themselves), and ``min_overlap`` is a share of one example's n-grams."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.steps.ngrams import EvalIndex, ngram_hash, ngram_hashes, threshold, words

VOCAB = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
word_lists = st.lists(st.sampled_from(VOCAB), max_size=40)


def _seq(prefix: str, k: int) -> list[str]:
    """``k`` distinct words without digits (numbers normalise to ``0``)."""
    return [prefix + chr(97 + i // 26) + chr(97 + i % 26) for i in range(k)]


def test_normalisation_matches_datatrove_defaults() -> None:
    assert words("The QUICK, brown fox!  Jumped--over\tthe_lazy dog.") == \
        ["the", "quick", "brown", "fox", "jumped", "over", "the", "lazy", "dog"]
    assert words("Café naïve résumé") == ["cafe", "naive", "resume"]
    assert words("In 1999 it cost 3.50, or 1,000 yen") == \
        ["in", "0", "it", "cost", "0", "or", "0", "yen"]
    assert words("") == [] and words(" ... !!! ") == []


@given(word_lists, st.randoms(use_true_random=False))
def test_case_punctuation_and_spacing_do_not_change_the_words(ws: list[str], rnd) -> None:
    seps = [" ", "  ", ", ", ". ", "! ", " -- ", "\n", "; ", "\t", " (", ") "]
    text = "".join((w.upper() if rnd.random() < 0.3 else w.capitalize() if rnd.random() < 0.3
                    else w) + rnd.choice(seps) for w in ws)
    assert words(text) == ws


@settings(max_examples=50)
@given(word_lists, st.integers(1, 6))
def test_vectorised_hashes_are_the_reference(ws: list[str], n: int) -> None:
    got = ngram_hashes(ws, n)
    assert len(got) == max(0, len(ws) - n + 1)
    assert [int(h) for h in got] == [ngram_hash(ws[i:i + n]) for i in range(len(got))]


def _grams(ws: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(ws[i:i + n]) for i in range(len(ws) - n + 1)}


@settings(max_examples=80)
@given(st.lists(word_lists, min_size=1, max_size=4), word_lists, st.integers(1, 4))
def test_hits_are_exactly_the_shared_ngrams(examples: list[list[str]], doc: list[str],
                                            n: int) -> None:
    index = EvalIndex([("set", [" ".join(e) for e in examples])], n)
    match = index.match(doc)
    evals = set().union(*(_grams(e, n) for e in examples))
    shared = _grams(doc, n) & evals
    assert match.hits == len(shared)
    assert match.set == ("set" if shared else "")
    assert {tuple(doc[p:p + n]) for p in match.positions} == shared


@settings(max_examples=60)
@given(word_lists, word_lists, word_lists, st.integers(3, 8))
def test_a_planted_passage_is_found_whatever_surrounds_it(before: list[str], passage: list[str],
                                                          after: list[str], n: int) -> None:
    passage = passage + ["omega"] * n  # at least n words
    index = EvalIndex([("ev", [" ".join(passage)])], n)
    text = " ".join(before) + ". " + " ".join(passage).upper() + "! " + " ".join(after)
    match = index.match(words(text), 1.0)
    assert match.set == "ev" and match.overlap == 1.0


def test_min_overlap_is_a_share_of_one_examples_ngrams() -> None:
    example = " ".join(_seq("w", 20))  # 20 words: 8 distinct 13-grams
    index = EvalIndex([("ev", [example])])
    half = words(" ".join(_seq("w", 16)))  # 4 of the 8
    assert index.match(half, 0.0).set == "ev"
    assert index.match(half, 0.5).set == "ev" and index.match(half, 0.5).overlap == 0.5
    assert index.match(half, 0.6).set == ""
    assert index.match(half, 0.6).hits == 4  # measured all the same
    assert threshold(8, 0.0) == 1 and threshold(8, 0.5) == 4 and threshold(8, 0.51) == 5


def test_the_set_with_most_shared_ngrams_decides_and_short_examples_are_counted() -> None:
    a = " ".join(_seq("a", 14))
    b = " ".join(_seq("b", 20))
    index = EvalIndex([("one", [a, "too short"]), ("two", [b])])
    assert index.short == {"one": 1, "two": 0}
    assert index.examples_of("one") == 1 and index.ngrams_of("two") == 8
    match = index.match(words(a + " " + b))
    assert match.hits == 2 + 8 and match.set == "two"
    assert index.match(words(" ".join(_seq("a", 12)))).hits == 0
    assert EvalIndex([("empty", [])]).match(words(a)).hits == 0


def test_an_ngram_in_two_examples_and_two_sets() -> None:
    shared = " ".join(_seq("s", 13))
    index = EvalIndex([("x", [shared, shared + " more"]), ("y", [shared])])
    assert len(index.hashes) == 4 and np.all(np.diff(index.hashes.astype(np.float64)) >= 0)
    match = index.match(words(shared))
    assert match.hits == 1 and match.set == "x" and match.overlap == 1.0
