"""The cleaning pipeline: configured steps in order, with kept / changed / dropped counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.cleaning.normalize import (
    collapse_whitespace,
    fix_mojibake,
    normalize_unicode,
    strip_control,
)
from pipeline.cleaning.quality import alpha_fraction, repeated_line_fraction


@dataclass(frozen=True)
class CleaningConfig:
    """What to rewrite and what to drop. Defaults only drop empty documents."""

    fix_mojibake: bool = True
    min_chars: int = 1
    max_chars: int = 0  # 0: no limit
    min_alpha_frac: float = 0.0
    max_repeated_line_frac: float = 1.0


Rewrite = Callable[[str], str]
Filter = Callable[[str], bool]  # True: keep


class Cleaner:
    """Apply the cleaning steps to documents and keep the counts for the summary."""

    def __init__(self, config: CleaningConfig | None = None) -> None:
        cfg = config or CleaningConfig()
        self.rewrites: list[tuple[str, Rewrite]] = []
        if cfg.fix_mojibake:
            self.rewrites.append(("mojibake", fix_mojibake))
        self.rewrites += [("nfc", normalize_unicode), ("control", strip_control),
                          ("whitespace", collapse_whitespace)]
        self.filters: list[tuple[str, Filter]] = [("empty", bool)]
        if cfg.min_chars > 1:
            self.filters.append(("too_short", lambda t: len(t) >= cfg.min_chars))
        if cfg.max_chars > 0:
            self.filters.append(("too_long", lambda t: len(t) <= cfg.max_chars))
        if cfg.min_alpha_frac > 0:
            self.filters.append(("low_alpha", lambda t: alpha_fraction(t) >= cfg.min_alpha_frac))
        if cfg.max_repeated_line_frac < 1:
            self.filters.append(("repeated_lines", lambda t: repeated_line_fraction(t)
                                 <= cfg.max_repeated_line_frac))
        self.kept = 0
        self.dropped: Counter[str] = Counter()
        self.changed: Counter[str] = Counter()

    def __call__(self, text: str) -> str | None:
        """The cleaned text, or ``None`` when the document is dropped (reason counted)."""
        for name, step in self.rewrites:
            new = step(text)
            if new != text:
                self.changed[name] += 1
                text = new
        for name, keep in self.filters:
            if not keep(text):
                self.dropped[name] += 1
                return None
        self.kept += 1
        return text
