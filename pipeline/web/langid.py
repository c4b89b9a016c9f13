"""Language identification with py3langid, whose model ships inside the package (no download
at run time; 97 languages, ISO 639-1 codes).

Scores are normalised probabilities in [0, 1] (``--min-lang-score``, like datatrove's
``LanguageFilter`` on fastText's lid.176, whose model would have to be downloaded). The first
:data:`MAX_CHARS` characters decide: py3langid's cost grows with the text, and its answer
settles long before (same language on all 291 Debian manuals at 4,000 characters).
"""

from __future__ import annotations

import functools

#: characters of a document the language is identified from
MAX_CHARS = 10_000


@functools.lru_cache(maxsize=1)
def _identifier() -> object:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identify(text: str) -> tuple[str, float]:
    """``(language code, probability)`` of ``text``."""
    lang, score = _identifier().classify(text[:MAX_CHARS].replace("\n", " "))  # type: ignore
    return str(lang), float(score)
