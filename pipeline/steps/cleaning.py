"""The cleaner as a step (``clean``): Unicode repair and normalisation, then the length,
letter-share and repeated-line filters (:mod:`pipeline.cleaning`), with their flags' names as
its options. Its drop reasons keep their names (``empty``, ``too_short``, ...), as do its
change counts (``control``, ``mojibake``, ``nfc``, ``whitespace``): manifests compare across
versions."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pipeline.cleaning import Cleaner, CleaningConfig
from pipeline.steps.contract import Doc


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
