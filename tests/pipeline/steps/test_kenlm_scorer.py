"""KenLMPerplexity: CCNet's document perplexity under a bigram ARPA model the test writes,
checked against the backoff arithmetic done by hand; dropping above ``max_perplexity``; clear
errors; one load per process."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import kenlm
import pytest

from pipeline.steps import fasttext_scorer
from pipeline.steps.contract import Doc
from pipeline.steps.kenlm_scorer import KenLMPerplexity

#: log10 probabilities and backoff weights
ARPA = """
\\data\\
ngram 1=6
ngram 2=5

\\1-grams:
-1.5\t<unk>\t0
-99\t<s>\t-0.4
-1.0\t</s>\t0
-0.8\tthe\t-0.3
-1.1\tcat\t-0.25
-1.2\tsat\t-0.2

\\2-grams:
-0.3\t<s> the
-0.25\tthe cat
-0.35\tcat sat
-0.2\tsat </s>
-0.6\tthe sat

\\end\\
"""

# <s> the cat sat </s>: four seen bigrams
SEEN = -0.3 - 0.25 - 0.35 - 0.2
# <s> cat: backoff(<s>) + p(cat); cat the: backoff(cat) + p(the); the dog: dog is <unk>,
# backoff(the) + p(<unk>); dog </s>: p(</s>) (backoff of <unk> is 0)
UNSEEN = (-0.4 - 1.1) + (-0.25 - 0.8) + (-0.3 - 1.5) + (-1.0)
# an empty line: <s> </s> = backoff(<s>) + p(</s>)
EMPTY = -0.4 - 1.0


@pytest.fixture(scope="module")
def arpa(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("kenlm") / "tiny.arpa"
    path.write_text(ARPA.lstrip("\n"), encoding="utf-8")
    return str(path)


def score(text: str, arpa: str, **options: object) -> tuple[object, Doc]:
    doc = Doc("d", text)
    return KenLMPerplexity(arpa, **options)(doc), doc


def test_perplexity_matches_the_hand_computation(arpa: str) -> None:
    step = KenLMPerplexity(arpa)
    assert (step.name, step.version, step.signals) == ("kenlm", "1", {"perplexity": float})
    out, doc = score("the cat sat", arpa)
    assert out is doc
    assert doc.signals["perplexity"] == pytest.approx(10 ** (-SEEN / 4), rel=1e-5)
    _, doc = score("cat the dog", arpa)
    assert doc.signals["perplexity"] == pytest.approx(10 ** (-UNSEEN / 4), rel=1e-5)
    # lines are sentences: log10 scores summed, words + one </s> per line
    _, doc = score("the cat sat\ncat the dog", arpa)
    assert doc.signals["perplexity"] == pytest.approx(10 ** (-(SEEN + UNSEEN) / 8), rel=1e-5)
    # as in CCNet, a blank line counts (<s> </s>)
    _, doc = score("the cat sat\n", arpa)
    assert doc.signals["perplexity"] == pytest.approx(10 ** (-(SEEN + EMPTY) / 5), rel=1e-5)
    assert isinstance(doc.signals["perplexity"], float)


def test_seen_bigrams_score_lower_than_random_words(arpa: str) -> None:
    seen = score("the cat sat\nthe sat", arpa)[1].signals["perplexity"]
    random_words = score("sat the cat\ncat dog the", arpa)[1].signals["perplexity"]
    assert seen < random_words / 3


def test_max_perplexity_drops_above_it_and_annotates_otherwise(arpa: str) -> None:
    out, doc = score("cat the dog", arpa)
    assert out is doc  # no max_perplexity: annotate only
    threshold = 10 ** (-SEEN / 4) * 2
    assert score("the cat sat", arpa, max_perplexity=threshold)[0] is not None
    out, doc = score("cat the dog", arpa, max_perplexity=threshold)
    assert out == (None, "perplexity") and doc.signals["perplexity"] > threshold
    for bad in (0, -1.0, float("nan"), float("inf"), "10", True):
        with pytest.raises(ValueError, match="max_perplexity"):
            KenLMPerplexity(arpa, max_perplexity=bad)


def test_missing_and_foreign_models_are_clear_errors(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "none.arpa"
    with pytest.raises(ValueError, match=re.escape(f"{missing}: cannot read")):
        KenLMPerplexity(str(missing))
    garbage = tmp_path / "garbage.arpa"
    garbage.write_text("this is no language model\n")
    with pytest.raises(ValueError, match=re.escape(f"{garbage}: not an ARPA or KenLM")):
        KenLMPerplexity(str(garbage))
    binary = tmp_path / "garbage.bin"
    binary.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match=re.escape(f"{binary}: not an ARPA or KenLM")):
        KenLMPerplexity(str(binary))
    monkeypatch.setattr(fasttext_scorer, "_MODELS", {})
    monkeypatch.setitem(sys.modules, "kenlm", None)  # not installed
    good = tmp_path / "good.arpa"
    good.write_text(ARPA.lstrip("\n"))
    with pytest.raises(ValueError, match="kenlm module is not installed"):
        KenLMPerplexity(str(good))


def test_the_model_is_loaded_once_per_process(arpa: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fasttext_scorer, "_MODELS", {})
    calls: list[str] = []
    real = kenlm.Model

    def counting(path: str, *args: object) -> object:
        calls.append(path)
        return real(path, *args)

    monkeypatch.setattr(kenlm, "Model", counting)
    steps = [KenLMPerplexity(arpa), KenLMPerplexity(arpa, max_perplexity=50.0)]
    assert calls == [arpa] and steps[0]._model is steps[1]._model
