"""The cleaner as a step (``clean``): Unicode repair and normalisation, then the length,
letter-share and repeated-line filters (:mod:`pipeline.cleaning`), with their flags' names as
its options. Its drop reasons keep their names (``empty``, ``too_short``, ...), as do its
change counts (``control``, ``mojibake``, ``nfc``, ``whitespace``): manifests compare across
versions. And ``length``: characters, words and lines as signals, or a word-count filter."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from pipeline.cleaning import Cleaner, CleaningConfig
from pipeline.config_field import flag
from pipeline.steps.contract import Doc


@dataclass
class CleaningFlags:
    """The ``clean`` step's options as ``pipeline run`` flags (the default recipe's cleaner;
    a recipe gives them as the step's options instead)."""

    fix_mojibake: bool = flag(True, "repair mojibake (UTF-8 read as Latin-1/cp1252) with ftfy")
    min_chars: int = flag(1, "drop documents shorter than this after cleaning (too_short)")
    max_chars: int = flag(0, "drop documents longer than this after cleaning (0: no limit)")
    min_alpha_frac: float = flag(0.0, "drop documents whose share of letters among visible "
                                 "characters is below this (low_alpha; 0: off)")
    max_repeated_line_frac: float = flag(1.0, "drop documents whose share of repeated lines "
                                         "exceeds this (repeated_lines; 1: off)")

    @property
    def cleaning(self) -> CleaningConfig:
        return CleaningConfig(self.fix_mojibake, self.min_chars, self.max_chars,
                              self.min_alpha_frac, self.max_repeated_line_frac)


class Clean:
    """Repair and normalise the text; drop empty, too short/long, low-letter or repetitive
    documents."""

    name = "clean"
    version = "1"
    #: its reasons are counted as they are, not under ``clean.``
    qualified_reasons = True

    def __init__(self, fix_mojibake: bool = True, min_chars: int = 1, max_chars: int = 0,
                 min_alpha_frac: float = 0.0, max_repeated_line_frac: float = 1.0) -> None:
        self.cleaner = Cleaner(CleaningConfig(fix_mojibake, min_chars, max_chars,
                                              min_alpha_frac, max_repeated_line_frac))

    @property
    def changed(self) -> Counter[str]:
        return self.cleaner.changed

    def __call__(self, doc: Doc) -> Doc | tuple[None, str]:
        text = self.cleaner.rewrite(doc.text)
        reason = self.cleaner.rejection(text)
        if reason is not None:
            return None, reason
        doc.text = text
        return doc

    @classmethod
    def from_config(cls, cfg: CleaningConfig) -> dict[str, Any]:
        """The options that give ``cfg`` (the flags' shorthand)."""
        return {"fix_mojibake": cfg.fix_mojibake, "min_chars": cfg.min_chars,
                "max_chars": cfg.max_chars, "min_alpha_frac": cfg.min_alpha_frac,
                "max_repeated_line_frac": cfg.max_repeated_line_frac}


class Length:
    """Characters, words (whitespace-separated) and lines of each document; in filter mode
    drop those outside ``min_words``-``max_words`` (``length.too_few_words``,
    ``length.too_many_words``). In annotate mode (or filter mode with ``signals=True``) the
    counts are columns ``<name>.n_chars``, ``.n_words``, ``.n_lines``."""

    name = "length"
    version = "1"
    modes = ("filter", "annotate")
    SIGNALS = {"n_chars": int, "n_words": int, "n_lines": int}

    def __init__(self, min_words: int = 0, max_words: int = 0, mode: str = "filter") -> None:
        self.min_words, self.max_words = int(min_words), int(max_words)
        self.annotate = mode == "annotate"
        self.signals: dict[str, type] = dict(self.SIGNALS) if self.annotate else {}

    def __call__(self, doc: Doc) -> Doc | tuple[None, str]:
        text = doc.text
        n_words = len(text.split())
        if self.annotate:
            doc.signals.update(n_chars=len(text), n_words=n_words,
                               n_lines=text.count("\n") + 1 if text else 0)
            return doc
        if self.min_words and n_words < self.min_words:
            return None, "too_few_words"
        if self.max_words and n_words > self.max_words:
            return None, "too_many_words"
        return doc
