"""Gopher's quality and repetition rules (Rae et al. 2021, appendix A, table A1), with the
defaults and the reason names of datatrove's ``GopherQualityFilter`` and
``GopherRepetitionFilter``, so that decisions compare one to one.

Each rule is off when its threshold is 0 / None. Words are :func:`pipeline.web.words.words`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from pipeline.web.text import Text
from pipeline.web.words import is_symbol_word

STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")


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
