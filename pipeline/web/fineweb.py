"""FineWeb's own quality rules (Penedo et al. 2024, section 3.4; datatrove's
``FineWebQualityFilter``): too few lines ending in terminal punctuation, too many short lines,
too many characters in duplicated lines, too many newlines per word (lists).

Filter mode calls the rule set (``__call__`` stops at the first failing rule); annotate mode
calls :meth:`FineWebQuality.measure` (every signal, no early exit) and
:meth:`FineWebQuality.judge` (the decision from the signals alone, the same as ``__call__``'s
for every document: each ratio is computed as ``__call__`` computes it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from pipeline.web.gopher import Signal, duplicates
from pipeline.web.text import Text
from pipeline.web.words import ends_terminal


@dataclass(frozen=True)
class FineWebQuality:
    line_punct_thr: float = 0.12
    line_punct_exclude_zero: bool = False
    short_line_thr: float = 0.67
    short_line_length: int = 30
    char_duplicates_ratio: float = 0.01
    new_line_ratio: float = 0.3

    #: ``n_lines``: non-blank lines (0: the "empty" rule); ``n_words``: words (0: the list
    #: rule is off); the ratios are those the rules compare, 0.0 where ``__call__`` would not
    #: compute them (no lines, no words). ``short_line_ratio`` uses the configured
    #: ``short_line_length``.
    SIGNALS: ClassVar[dict[str, type]] = {
        "n_lines": int, "n_words": int, "line_punct_ratio": float, "short_line_ratio": float,
        "char_dup_ratio": float, "list_ratio": float}

    def signals(self) -> dict[str, type]:
        """The signals :meth:`measure` returns (the same for every configuration)."""
        return dict(self.SIGNALS)

    def __call__(self, doc: Text) -> str | None:
        text = doc.text
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            return "empty"
        ratio = sum(1 for line in lines if ends_terminal(line)) / len(lines)
        if ratio < self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            return "line_punct_ratio"
        ratio = sum(1 for line in lines if len(line) <= self.short_line_length) / len(lines)
        if ratio > self.short_line_thr:
            return "short_line_ratio"
        chars = len(text) - text.count("\n")
        if chars and duplicates(lines)[1] / chars > self.char_duplicates_ratio:
            return "char_dup_ratio"
        n_words = len(doc.words)
        if n_words and text.count("\n") / n_words > self.new_line_ratio:
            return "list_ratio"
        return None

    def measure(self, doc: Text) -> dict[str, Signal]:
        """Every signal the rules compare, for annotate mode (no early exit)."""
        text = doc.text
        lines = [line for line in text.split("\n") if line.strip()]
        n_words = len(doc.words)
        out: dict[str, Signal] = {"n_lines": len(lines), "n_words": n_words,
                                  "line_punct_ratio": 0.0, "short_line_ratio": 0.0,
                                  "char_dup_ratio": 0.0, "list_ratio": 0.0}
        if lines:
            out["line_punct_ratio"] = sum(1 for line in lines if ends_terminal(line)) / len(lines)
            out["short_line_ratio"] = sum(
                1 for line in lines if len(line) <= self.short_line_length) / len(lines)
            # a non-blank line has a character that is not a newline: chars >= 1
            chars = len(text) - text.count("\n")
            out["char_dup_ratio"] = duplicates(lines)[1] / chars
        if n_words:
            out["list_ratio"] = text.count("\n") / n_words
        return out

    def judge(self, signals: Mapping[str, Signal]) -> str | None:
        """The reason ``__call__`` gives, decided from :meth:`measure`'s signals alone."""
        if not signals["n_lines"]:
            return "empty"
        ratio = signals["line_punct_ratio"]
        if ratio < self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            return "line_punct_ratio"
        if signals["short_line_ratio"] > self.short_line_thr:
            return "short_line_ratio"
        if signals["char_dup_ratio"] > self.char_duplicates_ratio:
            return "char_dup_ratio"
        if signals["n_words"] and signals["list_ratio"] > self.new_line_ratio:
            return "list_ratio"
        return None
