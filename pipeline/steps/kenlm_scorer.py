"""A KenLM n-gram model's perplexity of each document, CCNet's way: ``<name>.perplexity``.

CCNet ranks a language's pages by a KenLM model trained on Wikipedia: low perplexity is
Wikipedia-like text. Each line is scored as a sentence (``<s>`` ... ``</s>``), the log10
probabilities are summed over the document's lines, and the perplexity is
``10 ** (-sum / (words + lines))`` (each line's ``</s>`` is predicted too). Every line
counts, blank ones too (each is ``<s> </s>``), as in CCNet, so that its cut-offs apply; the
value is not rounded (CCNet rounds to one decimal).

The text is scored as it is, split on whitespace: a model trained on normalised or
SentencePiece-tokenised text (CCNet's own) wants the same done to the text by a step before
this one. The model, ARPA or KenLM binary, local or any fsspec URL, is loaded once per process
(:func:`pipeline.steps.fasttext_scorer.cached_model`). The binding is the ``kenlm`` module,
from the ``camel-kenlm`` wheel (``kenlm`` on the registry is a source package that compiles
for minutes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pipeline.steps.contract import Doc
from pipeline.steps.fasttext_scorer import cached_model
from storage import display_url


def _load_kenlm(model: str) -> Callable[[str], Any]:
    """A loader for :func:`cached_model` whose errors name ``model``."""

    def load(path: str) -> Any:
        try:
            import kenlm
        except ImportError:
            raise ValueError(f"kenlm model {display_url(model)}: the kenlm module is not "
                             "installed (pip install camel-kenlm)") from None
        try:
            return kenlm.Model(path)
        except (OSError, RuntimeError, ValueError) as exc:  # KenLM's FormatLoadException
            reason = (str(exc).replace(f"Cannot read model '{path}' ", "")
                      .replace(path, display_url(model)).strip() or type(exc).__name__)
            if reason.startswith("(") and reason.endswith(")"):
                reason = reason[1:-1]
            raise ValueError(f"kenlm model {display_url(model)}: not an ARPA or KenLM binary "
                             f"model ({reason.splitlines()[0][:300]})") from None

    return load


def _check_max(max_perplexity: float | None) -> float | None:
    if max_perplexity is None:
        return None
    if isinstance(max_perplexity, bool) or not isinstance(max_perplexity, int | float) \
            or not math.isfinite(max_perplexity) or max_perplexity <= 0:
        raise ValueError(f"kenlm max_perplexity: a positive number, got {max_perplexity!r}")
    return float(max_perplexity)


def perplexity(model: Any, text: str) -> float:
    """CCNet's document perplexity of ``text`` under a loaded ``kenlm.Model``."""
    log10 = 0.0
    length = 0
    for line in text.split("\n"):
        log10 += model.score(line, bos=True, eos=True)
        length += len(line.split()) + 1
    exponent = -log10 / length
    return math.inf if exponent > 300 else float(10.0 ** exponent)


class KenLMPerplexity:
    """Write the document's perplexity under a KenLM model; drop documents above
    ``max_perplexity`` when it is given (reason ``perplexity``), else annotate only.

    Options: ``model`` (an ARPA or KenLM binary file, a local path or fsspec URL),
    ``max_perplexity`` (optional), ``storage_options`` (the run's, for a remote model).
    Signal: ``perplexity`` (float; also written for a document that is then dropped, which
    a recipe in annotate mode keeps).
    """

    name = "kenlm"
    version = "1"
    wants_storage_options = True
    signals: dict[str, type] = {"perplexity": float}

    def __init__(self, model: str, max_perplexity: float | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"kenlm model: a path or URL, got {model!r}")
        self.model = model
        self.max_perplexity = _check_max(max_perplexity)
        self._model = cached_model(model, storage_options, "kenlm", _load_kenlm(model))

    def __call__(self, doc: Doc) -> Doc | tuple[None, str]:
        value = perplexity(self._model, doc.text)
        doc.signals["perplexity"] = value
        if self.max_perplexity is not None and value > self.max_perplexity:
            return None, "perplexity"
        return doc
