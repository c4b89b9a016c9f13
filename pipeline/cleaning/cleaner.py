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


MAX_PASSES = 4


class Cleaner:
    """Apply the cleaning steps to documents and keep the counts for the summary."""

    def __init__(self, config: CleaningConfig | None = None) -> None:
        cfg = config or CleaningConfig()
        self.rewrites: list[tuple[str, Rewrite]] = []
        # Controls go first: one inside a mojibake sequence (``"Â\x1f¡"``) hides it from the
        # repair, and removing it afterwards would expose new mojibake, so cleaning would not
        # be idempotent (found by the property test).
        self.rewrites.append(("control", strip_control))
        if cfg.fix_mojibake:
            self.rewrites.append(("mojibake", fix_mojibake))
        self.rewrites += [("nfc", normalize_unicode), ("whitespace", collapse_whitespace)]
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
        """The cleaned text, or ``None`` when the document is dropped (reason counted).

        The steps run until nothing changes (at most ``MAX_PASSES`` times): one step can expose
        work for an earlier one (stripping a leading space leaves ``"Â¡"``, mojibake for
        ``"¡"``), and cleaning must be idempotent so that re-running a pipeline on its own
        output changes nothing. Clean text costs one pass, and so does ASCII text: no step
        can create work for another in it (mojibake and NFC need non-ASCII characters, the
        whitespace step creates no controls, and each step is idempotent on its own).
        """
        text = self.rewrite(text)
        reason = self.rejection(text)
        if reason is not None:
            self.dropped[reason] += 1
            return None
        self.kept += 1
        return text

    def rewrite(self, text: str) -> str:
        """The text after the rewrites, run to a fixed point (see :meth:`__call__`); what
        changed is counted."""
        changed: set[str] = set()
        for _ in range(MAX_PASSES):
            before = text
            for name, step in self.rewrites:
                new = step(text)
                if new != text:
                    changed.add(name)
                    text = new
            if text == before or text.isascii():
                break
        if changed:
            self.changed.update(changed)
        return text

    def rejection(self, text: str) -> str | None:
        """The first filter's name that drops ``text`` (not counted here), or ``None``."""
        for name, keep in self.filters:
            if not keep(text):
                return name
        return None
