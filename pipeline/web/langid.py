"""Language identification with py3langid, whose model ships inside the package (no download
at run time; ISO 639-1 codes, and ISO 639-3 where there is none: :func:`known_languages`, which
``--languages`` is checked against).

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


def known_languages() -> frozenset[str]:
    """The language codes the bundled model can answer (ISO 639-1, lower case)."""
    return frozenset(str(c) for c in _identifier().nb_classes)  # type: ignore[attr-defined]


def check_languages(codes: tuple[str, ...]) -> tuple[str, ...]:
    """``codes`` when the model knows each of them; else a ``ValueError`` naming the unknown
    ones (``--languages xx`` kept no document, rc 0: no page is ever identified as ``xx``)."""
    unknown = [c for c in codes if c not in known_languages()]
    if unknown:
        raise ValueError(f"--languages: unknown language code{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))} (py3langid knows: "
                         f"{', '.join(sorted(known_languages()))})")
    return codes


def identify(text: str) -> tuple[str, float]:
    """``(language code, probability)`` of ``text``."""
    lang, score = _identifier().classify(text[:MAX_CHARS].replace("\n", " "))  # type: ignore
    return str(lang), float(score)
