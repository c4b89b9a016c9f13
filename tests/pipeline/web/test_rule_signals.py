"""Annotate mode decides as filter mode does: for every rule set and every document,
``judge(measure(doc))`` is the reason ``rule(doc)`` gives (and C4's kept text is the same), on
generated texts under default, changed and switched-off options, with thresholds set exactly
to a document's own measured values (where ``>`` and ``>=`` part), and on every page of the
published WARC test corpus. ``measure`` returns exactly the declared signals, typed as
declared: they become per-document columns."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.readers import ReadOptions, warc
from pipeline.records import Document
from pipeline.web.c4 import C4Quality
from pipeline.web.extract import html_to_text
from pipeline.web.fineweb import FineWebQuality
from pipeline.web.gopher import GopherQuality, GopherRepetition
from pipeline.web.text import Text

WARCS = Path(__file__).parents[1] / "readers" / "data"
EXAMPLES = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---------------------------------------------------------------------------- documents

TOKENS = ("the", "be", "to", "of", "and", "that", "have", "with", "cat", "sat", "on", "mat",
          "a", "extraordinarily", "supercalifragilisticexpialidocious", "x" * 30, "42", "3.14",
          "café", "naïve", "Ελλάδα", "東京", "сегодня", "#", "##", "#tag", "...", "…", "word...",
          "•", "-", "—", ",", ".", "!", "?", ";", "(", ")", '"', "'", "$", "%", "&", "{",
          "}", "[1]", "[edit]", "[citation needed]", "lorem ipsum", "Lorem Ipsum", "javascript",
          "JavaScript", "privacy policy", "terms of use", "uses cookies", "don't", "e.g.",
          "http://example.org/x", "a@b.org", "x=1", "2024-05-01", "\t")
PREFIXES = ("", "", "", "• ", "- ", "  ", "# ", "1. ")
SUFFIXES = ("", ".", ".", "!", "?", '"', "'", "...", "…", " [1].", " {", ":")
SEPARATORS = ("\n", "\n", "\n", "\n\n", "\n\n\n", " \n", "\n \n", "\r\n", "\n\t\n")


@st.composite
def lines(draw: st.DrawFn) -> str:
    body = " ".join(draw(st.lists(st.sampled_from(TOKENS), max_size=14)))
    return draw(st.sampled_from(PREFIXES)) + body + draw(st.sampled_from(SUFFIXES))


@st.composite
def documents(draw: st.DrawFn) -> str:
    """Lines of words, punctuation, bullets and markers, some repeated, joined by one or more
    newlines (or as paragraphs); now and then any text at all, or next to none."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.text(max_size=300))
    if kind == 1:
        return draw(st.sampled_from(("", " ", "\n", "\n\n", ".", "#", "…", "{", "- ")))
    pool = draw(st.lists(lines(), min_size=1, max_size=8))
    order = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=24))
    separators = ("\n\n",) if kind in (2, 3) else SEPARATORS  # one line a paragraph
    out = [pool[order[0]]]
    for i in order[1:]:
        out += [draw(st.sampled_from(separators)), pool[i]]
    return "".join(out)


# ---------------------------------------------------------------------------- options

GQ_OPTIONS: list[dict[str, Any]] = [
    {},
    {"min_doc_words": 3, "min_stop_words": 1},
    {"min_doc_words": 1, "max_doc_words": 20, "min_alpha_words_ratio": 0.5,
     "max_bullet_lines_ratio": 0.2, "max_ellipsis_lines_ratio": 0.1, "min_stop_words": 0},
    {"min_doc_words": None, "max_doc_words": None, "min_avg_word_length": None,
     "max_avg_word_length": None, "max_symbol_word_ratio": None, "max_bullet_lines_ratio": None,
     "max_ellipsis_lines_ratio": None, "min_alpha_words_ratio": None, "min_stop_words": None},
    {"min_doc_words": 0, "min_avg_word_length": 0, "max_avg_word_length": 5.5,
     "max_symbol_word_ratio": 0.01, "stop_words": ("cat", "mat", "the")},
    {"min_doc_words": -1, "min_stop_words": 0, "min_alpha_words_ratio": 0},
    {"min_doc_words": 1, "min_avg_word_length": None, "max_avg_word_length": None,
     "max_symbol_word_ratio": None, "max_bullet_lines_ratio": None,
     "max_ellipsis_lines_ratio": None, "min_alpha_words_ratio": None, "min_stop_words": 3},
]
GR_OPTIONS: list[dict[str, Any]] = [
    {},
    {"dup_line_frac": None, "dup_para_frac": 0, "dup_line_char_frac": 0.5,
     "dup_para_char_frac": None},
    {"dup_line_frac": 0.05, "dup_para_frac": 0.05, "top_n_grams": ((3, 0.5), (2, 0.3)),
     "dup_n_grams": ((7, 0.2), (4, 0.05), (12, 0.01))},
    {"top_n_grams": (), "dup_n_grams": ((1, 0.3),)},
    {"dup_para_frac": None, "dup_para_char_frac": 0.05},
    {"dup_line_frac": None, "dup_para_frac": None, "dup_line_char_frac": None,
     "dup_para_char_frac": None, "top_n_grams": ((2, 0.0),), "dup_n_grams": ((5, 0.0),)},
]
C4_OPTIONS: list[dict[str, Any]] = [
    {},
    {"min_num_sentences": 1},
    {"min_num_sentences": -1, "min_words_per_line": -1, "max_word_length": -1},
    {"filter_no_terminal_punct": False, "min_words_per_line": 1, "min_num_sentences": 2},
    {"remove_citations": False, "filter_lorem_ipsum": False, "filter_javascript": False,
     "min_num_sentences": 0},
    {"filter_curly_bracket": False, "filter_policy": False, "filter_no_terminal_punct": False,
     "max_word_length": 8, "min_num_sentences": 1},
    {"filter_lorem_ipsum": False, "filter_javascript": False, "filter_no_terminal_punct": False,
     "min_words_per_line": 0, "min_num_sentences": 0},
]
FW_OPTIONS: list[dict[str, Any]] = [
    {},
    {"line_punct_exclude_zero": True},
    {"line_punct_thr": 0.9, "line_punct_exclude_zero": True},
    {"line_punct_thr": 0.0, "short_line_thr": 1.0, "char_duplicates_ratio": 0.5},
    {"line_punct_thr": 0.5, "short_line_length": 5, "new_line_ratio": 0.05},
    {"line_punct_thr": 0, "line_punct_exclude_zero": True, "short_line_thr": 0.0,
     "char_duplicates_ratio": 0.0, "new_line_ratio": 0.0},
    {"line_punct_thr": -1.0, "short_line_thr": 2.0, "char_duplicates_ratio": 9.0,
     "new_line_ratio": -1.0},
]


def gq_at_bounds(rule: GopherQuality, s: dict[str, Any]) -> GopherQuality:
    """Every threshold equal to the document's own value (0 / None stay as they are)."""
    return replace(rule, min_doc_words=s["n_words"], max_doc_words=s["n_words"],
                   min_avg_word_length=s["avg_word_length"],
                   max_avg_word_length=s["avg_word_length"],
                   max_symbol_word_ratio=max(s["hash_word_ratio"], s["ellipsis_word_ratio"]),
                   max_bullet_lines_ratio=s["bullet_lines_ratio"],
                   max_ellipsis_lines_ratio=s["ellipsis_lines_ratio"],
                   min_alpha_words_ratio=s["alpha_words_ratio"], min_stop_words=s["stop_words"])


def gr_at_bounds(rule: GopherRepetition, s: dict[str, Any]) -> GopherRepetition:
    names = ("dup_line_frac", "dup_para_frac", "dup_line_char_frac", "dup_para_char_frac")
    return replace(rule, **{n: s[n] for n in names},
                   top_n_grams=tuple((n, s[f"top_{n}_gram_frac"]) for n, _ in rule.top_n_grams),
                   dup_n_grams=tuple((n, s[f"dup_{n}_gram_frac"]) for n, _ in rule.dup_n_grams))


def c4_at_bounds(rule: C4Quality, s: dict[str, Any]) -> C4Quality:
    return replace(rule, min_num_sentences=s["n_sentences"])


def fw_at_bounds(rule: FineWebQuality, s: dict[str, Any]) -> FineWebQuality:
    return replace(rule, line_punct_thr=s["line_punct_ratio"],
                   short_line_thr=s["short_line_ratio"], char_duplicates_ratio=s["char_dup_ratio"],
                   new_line_ratio=s["list_ratio"])


# ---------------------------------------------------------------------------- the invariant

def check_text_rule(rule: Any, text: str) -> str | None:
    """Gopher and FineWeb: judge(measure(doc)) is rule(doc); returns the reason."""
    signals = rule.measure(Text(text))
    check_types(rule, signals)
    expected = rule(Text(text))
    assert rule.judge(signals) == expected, (rule, text, signals)
    return expected


def check_c4(rule: C4Quality, text: str) -> str | None:
    """C4: the same reason, and the same text when the page is kept."""
    new, signals = rule.measure(text)
    check_types(rule, signals)
    kept, expected = rule(text)
    assert rule.judge(signals) == expected, (rule, text, signals)
    if expected is None:
        assert new == kept, (rule, text)
    return expected


def check_types(rule: Any, signals: dict[str, Any]) -> None:
    declared = rule.signals()
    assert list(signals) == list(declared)
    for name, kind in declared.items():
        assert type(signals[name]) is kind, (name, signals[name])


def check(rule: Any, text: str) -> str | None:
    return check_c4(rule, text) if isinstance(rule, C4Quality) else check_text_rule(rule, text)


def check_all(base: Any, options: dict[str, Any], text: str,
              at_bounds: Any, bounds: bool) -> None:
    """The invariant under ``options``, then (when ``bounds``) with the thresholds moved onto
    the document's own measured values."""
    rule = replace(base, **options)
    check(rule, text)
    if bounds:
        signals = rule.measure(text)[1] if isinstance(rule, C4Quality) else \
            rule.measure(Text(text))
        check(at_bounds(rule, signals), text)


@EXAMPLES
@given(text=documents(), options=st.sampled_from(GQ_OPTIONS), bounds=st.booleans())
def test_gopher_quality_judges_as_it_filters(text: str, options: dict[str, Any],
                                             bounds: bool) -> None:
    check_all(GopherQuality(), options, text, gq_at_bounds, bounds)


@EXAMPLES
@given(text=documents(), options=st.sampled_from(GR_OPTIONS), bounds=st.booleans())
def test_gopher_repetition_judges_as_it_filters(text: str, options: dict[str, Any],
                                                bounds: bool) -> None:
    check_all(GopherRepetition(), options, text, gr_at_bounds, bounds)


@EXAMPLES
@given(text=documents(), options=st.sampled_from(C4_OPTIONS), bounds=st.booleans())
def test_c4_judges_as_it_filters(text: str, options: dict[str, Any], bounds: bool) -> None:
    check_all(C4Quality(), options, text, c4_at_bounds, bounds)


@EXAMPLES
@given(text=documents(), options=st.sampled_from(FW_OPTIONS), bounds=st.booleans())
def test_fineweb_judges_as_it_filters(text: str, options: dict[str, Any], bounds: bool) -> None:
    check_all(FineWebQuality(), options, text, fw_at_bounds, bounds)


# ---------------------------------------------------------------------------- fixed cases

@pytest.mark.parametrize("text", [
    "", " ", "\n\n", "# # #", "... …", "• a\n- b", "{", "lorem ipsum.",
    "The cat sat. The cat sat.\n\nThe cat sat. The cat sat.",
    "a javascript line { here.\nlorem ipsum dolor sit amet.\nOne two three {.",
    "One two three {.\nlorem ipsum dolor sit amet.",
    "lorem ipsum { on one line.",
    "We use cookies, see the privacy policy.\nThe javascript here is fine.\nThe cat sat on "
    "the mat. It was. Then it left.\nNo end here\nOne. Two. Three.",
])
@pytest.mark.parametrize("make", [GopherQuality, GopherRepetition, C4Quality, FineWebQuality])
def test_edge_cases(make: Any, text: str) -> None:
    base = make()
    every = {GopherQuality: GQ_OPTIONS, GopherRepetition: GR_OPTIONS, C4Quality: C4_OPTIONS,
             FineWebQuality: FW_OPTIONS}[make]
    for options in every:
        check(replace(base, **options), text)


def test_c4_first_page_drop_decides() -> None:
    """Lorem ipsum and a curly bracket: the line seen first gives the reason; on one line,
    lorem ipsum (checked first); a curly bracket in a javascript line is never seen."""
    rule = C4Quality()
    assert check(rule, "One two three {.\nlorem ipsum dolor sit amet.") == "curly_bracket"
    assert check(rule, "lorem ipsum dolor sit amet.\nOne two three {.") == "lorem_ipsum"
    assert check(rule, "lorem ipsum and { too.") == "lorem_ipsum"
    assert check(rule, "Some javascript { here.") == "too_few_sentences"
    new, signals = rule.measure("Some javascript { here.\nOne two three {.\nno end")
    assert signals["javascript_lines"] == 1 and signals["curly_bracket_line"] == 1
    assert signals["lorem_ipsum_line"] == -1 and signals["lines_removed"] == 2
    assert new == "One two three {."


def test_signals_are_declared() -> None:
    """``SIGNALS`` is the default configuration's ``signals()``; n-gram signals follow the
    configured n's."""
    for make in (GopherQuality, GopherRepetition, C4Quality, FineWebQuality):
        assert make().signals() == make.SIGNALS
        assert set(make.SIGNALS.values()) <= {int, float, bool}
    rule = GopherRepetition(top_n_grams=((3, 0.1),), dup_n_grams=((12, 0.1), (5, 0.2)))
    names = set(rule.signals())
    assert {"top_3_gram_frac", "dup_12_gram_frac", "dup_5_gram_frac"} <= names
    assert not {"top_2_gram_frac", "dup_6_gram_frac"} & names
    check(rule, "a b c a b c a b c a b c a b c a b c.")


# ---------------------------------------------------------------------------- real pages

def corpus() -> list[str]:
    """The text of every document in the published WARC files: HTML pages as extracted,
    other documents as read."""
    texts = []
    for path in sorted(WARCS.glob("*/*.warc*")):
        with open(path, "rb") as fh:
            for item in warc.read(fh, path.name, ReadOptions(), [0]):
                if isinstance(item, Document):
                    texts.append(html_to_text(item.text) if item.kind == "html" else item.text)
    return texts


@pytest.fixture(scope="module")
def pages() -> list[str]:
    return corpus()


@pytest.mark.parametrize(("make", "at_bounds"), [
    (GopherQuality, gq_at_bounds), (GopherRepetition, gr_at_bounds), (C4Quality, c4_at_bounds),
    (FineWebQuality, fw_at_bounds)])
def test_published_pages_judge_as_they_filter(pages: list[str], make: Any,
                                               at_bounds: Any) -> None:
    assert len(pages) >= 80
    for text in pages:
        check_all(make(), {}, text, at_bounds, bounds=True)


def test_published_pages_are_kept_and_dropped(pages: list[str]) -> None:
    """The corpus decides both ways for several rule sets, so the invariant is tested on
    both sides of the rules."""
    both = 0
    for rule in (GopherQuality(), GopherRepetition(), C4Quality(), FineWebQuality()):
        reasons = [check(rule, text) for text in pages]
        both += any(r is None for r in reasons) and any(r is not None for r in reasons)
    assert both >= 2
