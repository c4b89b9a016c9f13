"""Gopher's quality and repetition rules (Rae et al. 2021, appendix A, table A1), with the
defaults and the reason names of datatrove's ``GopherQualityFilter`` and
``GopherRepetitionFilter``, so that decisions compare one to one.

Each rule is off when its threshold is 0 / None. Words are :func:`pipeline.web.words.words`.

Two modes share one set of rules. Filter mode calls the rule set: ``__call__`` stops at the
first failing rule, which is cheapest when most pages are dropped. Annotate mode calls
:meth:`measure`, which computes every signal the rules compare (no early exit), and
:meth:`judge`, which decides from those signals alone. For every document
``judge(measure(doc)) == rule(doc)``: each signal is the value ``__call__`` compares, computed
the same way (the same float division, so threshold comparisons agree to the last bit), and
``judge`` makes the same comparisons in the same order. ``SIGNALS`` names the signals and their
types for the default configuration; ``signals()`` gives them for an instance's own (the
n-gram signals of :class:`GopherRepetition` follow its configured n's).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from pipeline.web.text import Text
from pipeline.web.words import is_symbol_word

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")

#: a signal's value: a count, a ratio or a flag
Signal = int | float | bool


@dataclass(frozen=True)
class GopherQuality:
    min_doc_words: int | None = 50
    max_doc_words: int | None = 100_000
    min_avg_word_length: float | None = 3
    max_avg_word_length: float | None = 10
    max_symbol_word_ratio: float | None = 0.1
    max_bullet_lines_ratio: float | None = 0.9
    max_ellipsis_lines_ratio: float | None = 0.3
    min_alpha_words_ratio: float | None = 0.8
    min_stop_words: int | None = 2
    stop_words: tuple[str, ...] = STOP_WORDS

    #: ``n_words`` counts words that are not symbol-words (datatrove's count for the length
    #: rules); ``n_all_words`` counts every word (the ratios' denominator, and the empty-page
    #: rule). Ratios are 0.0 when their denominator is 0 (the rules do not look at them then).
    SIGNALS: ClassVar[dict[str, type]] = {
        "n_words": int, "n_all_words": int, "avg_word_length": float,
        "hash_word_ratio": float, "ellipsis_word_ratio": float, "bullet_lines_ratio": float,
        "ellipsis_lines_ratio": float, "alpha_words_ratio": float, "stop_words": int}

    def signals(self) -> dict[str, type]:
        """The signals :meth:`measure` returns (the same for every configuration)."""
        return dict(self.SIGNALS)

    def __call__(self, doc: Text) -> str | None:
        """Why the document is dropped, or ``None``."""
        text, words = doc.text, doc.words
        n_words = len(words)
        kept = [w for w in words if not is_symbol_word(w)]
        n = len(kept)
        if self.min_doc_words and n < self.min_doc_words:
            return "short_doc"
        if self.max_doc_words and n > self.max_doc_words:
            return "long_doc"
        if n:
            avg = sum(map(len, kept)) / n
            if self.min_avg_word_length and avg < self.min_avg_word_length:
                return "below_avg_threshold"
            if self.max_avg_word_length and avg > self.max_avg_word_length:
                return "above_avg_threshold"
        if not n_words:
            return "short_doc" if self.min_doc_words else None
        if self.max_symbol_word_ratio:
            if text.count("#") / n_words > self.max_symbol_word_ratio:
                return "too_many_hashes"
            if (text.count("...") + text.count("…")) / n_words > self.max_symbol_word_ratio:
                return "too_many_ellipsis"
        lines = text.splitlines() or [""]
        if self.max_bullet_lines_ratio and sum(
                s.lstrip().startswith(("•", "-")) for s in lines) / len(lines) \
                > self.max_bullet_lines_ratio:
            return "too_many_bullets"
        if self.max_ellipsis_lines_ratio and sum(
                s.rstrip().endswith(("...", "…")) for s in lines) / len(lines) \
                > self.max_ellipsis_lines_ratio:
            return "too_many_end_ellipsis"
        if self.min_alpha_words_ratio and sum(
                1 for w in words if _has_alpha(w)) / n_words < self.min_alpha_words_ratio:
            return "below_alpha_threshold"
        if self.min_stop_words and len(set(self.stop_words).intersection(words)) \
                < self.min_stop_words:
            return "enough_stop_words"
        return None

    def measure(self, doc: Text) -> dict[str, Signal]:
        """Every signal the rules compare, for annotate mode (no early exit)."""
        text, words = doc.text, doc.words
        n_all = len(words)
        kept = [w for w in words if not is_symbol_word(w)]
        lines = text.splitlines() or [""]
        return {
            "n_words": len(kept),
            "n_all_words": n_all,
            "avg_word_length": sum(map(len, kept)) / len(kept) if kept else 0.0,
            "hash_word_ratio": _ratio(text.count("#"), n_all),
            "ellipsis_word_ratio": _ratio(text.count("...") + text.count("…"), n_all),
            "bullet_lines_ratio": sum(
                s.lstrip().startswith(("•", "-")) for s in lines) / len(lines),
            "ellipsis_lines_ratio": sum(
                s.rstrip().endswith(("...", "…")) for s in lines) / len(lines),
            "alpha_words_ratio": _ratio(sum(1 for w in words if _has_alpha(w)), n_all),
            "stop_words": len(set(self.stop_words).intersection(words)),
        }

    def judge(self, signals: Mapping[str, Signal]) -> str | None:
        """The reason ``__call__`` gives, decided from :meth:`measure`'s signals alone."""
        return self._judge_words(signals) or self._judge_ratios(signals)

    def _judge_words(self, s: Mapping[str, Signal]) -> str | None:
        """The word-count and word-length rules."""
        n = s["n_words"]
        if self.min_doc_words and n < self.min_doc_words:
            return "short_doc"
        if self.max_doc_words and n > self.max_doc_words:
            return "long_doc"
        if n:
            avg = s["avg_word_length"]
            if self.min_avg_word_length and avg < self.min_avg_word_length:
                return "below_avg_threshold"
            if self.max_avg_word_length and avg > self.max_avg_word_length:
                return "above_avg_threshold"
        return None

    def _judge_ratios(self, s: Mapping[str, Signal]) -> str | None:
        """The rules after the word-length ones, in ``__call__``'s order."""
        if not s["n_all_words"]:
            return "short_doc" if self.min_doc_words else None
        if self.max_symbol_word_ratio:
            if s["hash_word_ratio"] > self.max_symbol_word_ratio:
                return "too_many_hashes"
            if s["ellipsis_word_ratio"] > self.max_symbol_word_ratio:
                return "too_many_ellipsis"
        if self.max_bullet_lines_ratio and s["bullet_lines_ratio"] > self.max_bullet_lines_ratio:
            return "too_many_bullets"
        if self.max_ellipsis_lines_ratio and \
                s["ellipsis_lines_ratio"] > self.max_ellipsis_lines_ratio:
            return "too_many_end_ellipsis"
        if self.min_alpha_words_ratio and s["alpha_words_ratio"] < self.min_alpha_words_ratio:
            return "below_alpha_threshold"
        if self.min_stop_words and s["stop_words"] < self.min_stop_words:
            return "enough_stop_words"
        return None


def _ratio(count: int, total: int) -> float:
    """``count / total`` as the rules divide, 0.0 for no total (a rule never reads it then)."""
    return count / total if total else 0.0


_ALPHA = re.compile(r"[^\W\d_]")


def _has_alpha(word: str) -> bool:
    return word.isalpha() or _ALPHA.search(word) is not None


def duplicates(items: list[str]) -> tuple[int, int]:
    """``(repeated items, their characters)``: every occurrence after an item's first."""
    seen: set[str] = set()
    n = chars = 0
    for item in items:
        if item in seen:
            n += 1
            chars += len(item)
        else:
            seen.add(item)
    return n, chars


def top_ngram_chars(words: list[str], n: int) -> int:
    """Characters covered by the most frequent word n-gram (joined by spaces) x its count;
    among equally frequent n-grams, the first to occur."""
    grams = Counter(zip(*(words[i:] for i in range(n)), strict=False))
    if not grams:
        return 0
    gram, count = grams.most_common(1)[0]
    return (sum(map(len, gram)) + n - 1) * count


def duplicate_ngram_chars(words: list[str], n: int) -> int:
    """Characters in word n-grams (joined without spaces) that repeat an earlier one; a
    repeat is skipped over whole, so overlapping repeats are not counted twice."""
    seen: set[str] = set()
    chars = i = 0
    last = len(words) - n + 1
    while i < last:
        gram = "".join(words[i:i + n])
        if gram in seen:
            chars += len(gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars


_PARAGRAPHS = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")


@dataclass(frozen=True)
class GopherRepetition:
    dup_line_frac: float | None = 0.3
    dup_para_frac: float | None = 0.3
    dup_line_char_frac: float | None = 0.2
    dup_para_char_frac: float | None = 0.2
    top_n_grams: tuple[tuple[int, float], ...] = ((2, 0.2), (3, 0.18), (4, 0.16))
    dup_n_grams: tuple[tuple[int, float], ...] = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12),
                                                   (9, 0.11), (10, 0.10))

    #: ``n_chars`` is the text's length (0: the "empty" rule); the fractions are repeated
    #: paragraphs / lines over their count, and characters over ``n_chars`` (0.0 for an empty
    #: text). The n-gram keys here are the default n's: :meth:`signals` gives an instance's.
    SIGNALS: ClassVar[dict[str, type]] = {
        "n_chars": int, "dup_para_frac": float, "dup_para_char_frac": float,
        "dup_line_frac": float, "dup_line_char_frac": float,
        **{f"top_{n}_gram_frac": float for n in (2, 3, 4)},
        **{f"dup_{n}_gram_frac": float for n in range(5, 11)}}

    def signals(self) -> dict[str, type]:
        """The signals :meth:`measure` returns for this configuration: the fixed ones, then
        ``top_<n>_gram_frac`` and ``dup_<n>_gram_frac`` for the configured n's."""
        out = {k: v for k, v in self.SIGNALS.items() if not k.endswith("_gram_frac")}
        out.update((f"top_{n}_gram_frac", float) for n, _ in self.top_n_grams)
        out.update((f"dup_{n}_gram_frac", float) for n, _ in self.dup_n_grams)
        return out

    def __call__(self, doc: Text) -> str | None:
        text = doc.text
        if not text:
            return "empty"
        paragraphs = _PARAGRAPHS.split(text.strip())
        n, chars = duplicates(paragraphs)
        if self.dup_para_frac and n / len(paragraphs) > self.dup_para_frac:
            return "dup_para_frac"
        if self.dup_para_char_frac and chars / len(text) > self.dup_para_char_frac:
            return "dup_para_char_frac"
        lines = _LINES.split(text)
        n, chars = duplicates(lines)
        if self.dup_line_frac and n / len(lines) > self.dup_line_frac:
            return "dup_line_frac"
        if self.dup_line_char_frac and chars / len(text) > self.dup_line_char_frac:
            return "dup_line_char_frac"
        words = doc.words
        for n_words, frac in self.top_n_grams:
            if top_ngram_chars(words, n_words) / len(text) > frac:
                return f"top_{n_words}_gram"
        for n_words, frac in self.dup_n_grams:
            if duplicate_ngram_chars(words, n_words) / len(text) > frac:
                return f"duplicated_{n_words}_n_grams"
        return None

    def measure(self, doc: Text) -> dict[str, Signal]:
        """Every signal the rules compare, for annotate mode (no early exit: every configured
        n-gram size is counted, which costs what ``__call__`` costs on a page it keeps)."""
        text = doc.text
        size = len(text)
        paragraphs = _PARAGRAPHS.split(text.strip())
        para_n, para_chars = duplicates(paragraphs)
        lines = _LINES.split(text)
        line_n, line_chars = duplicates(lines)
        out: dict[str, Signal] = {
            "n_chars": size,
            "dup_para_frac": para_n / len(paragraphs),
            "dup_para_char_frac": _ratio(para_chars, size),
            "dup_line_frac": line_n / len(lines),
            "dup_line_char_frac": _ratio(line_chars, size),
        }
        words = doc.words
        for n, _ in self.top_n_grams:
            out[f"top_{n}_gram_frac"] = _ratio(top_ngram_chars(words, n), size)
        for n, _ in self.dup_n_grams:
            out[f"dup_{n}_gram_frac"] = _ratio(duplicate_ngram_chars(words, n), size)
        return out

    def judge(self, signals: Mapping[str, Signal]) -> str | None:
        """The reason ``__call__`` gives, decided from :meth:`measure`'s signals alone."""
        if not signals["n_chars"]:
            return "empty"
        return self._judge_duplicates(signals) or self._judge_ngrams(signals)

    def _judge_duplicates(self, s: Mapping[str, Signal]) -> str | None:
        """The repeated paragraph and line rules, in ``__call__``'s order."""
        for name in ("dup_para_frac", "dup_para_char_frac", "dup_line_frac",
                     "dup_line_char_frac"):
            threshold = getattr(self, name)
            if threshold and s[name] > threshold:
                return name
        return None

    def _judge_ngrams(self, s: Mapping[str, Signal]) -> str | None:
        """The n-gram rules (never off: a threshold of 0 drops any page with an n-gram)."""
        for n, frac in self.top_n_grams:
            if s[f"top_{n}_gram_frac"] > frac:
                return f"top_{n}_gram"
        for n, frac in self.dup_n_grams:
            if s[f"dup_{n}_gram_frac"] > frac:
                return f"duplicated_{n}_n_grams"
        return None
