"""FineWeb's own quality rules (Penedo et al. 2024, section 3.4; datatrove's
``FineWebQualityFilter``): too few lines ending in terminal punctuation, too many short lines,
too many characters in duplicated lines, too many newlines per word (lists)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.web.gopher import duplicates
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
