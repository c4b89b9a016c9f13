"""Cleaning: small steps, each either rewriting a document or dropping it with a reason.

``Cleaner`` runs the steps in order and counts, per step, how many documents it changed and
how many it dropped, so the run summary and the manifest say what happened to every document.
"""

from pipeline.cleaning.cleaner import Cleaner, CleaningConfig
from pipeline.cleaning.normalize import (
    collapse_whitespace,
    fix_mojibake,
    normalize_unicode,
    strip_control,
)
from pipeline.cleaning.quality import alpha_fraction, repeated_line_fraction

__all__ = ["Cleaner", "CleaningConfig", "alpha_fraction", "collapse_whitespace", "fix_mojibake",
           "normalize_unicode", "repeated_line_fraction", "strip_control"]
