"""FastTextScorer: label probabilities as signals from a model the test trains (two topics),
clear errors for a missing or foreign model file, and one load per process."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import fasttext
import fsspec
import pytest

from pipeline.steps import fasttext_scorer
from pipeline.steps.contract import Doc, signal_type
from pipeline.steps.fasttext_scorer import FastTextScorer

SPACE = [
    "galaxy", "telescope", "orbit", "planet", "comet", "nebula", "stellar", "quasar", "cosmic",
    "asteroid"
]
FOOD = ["recipe", "kitchen", "flour", "oven", "butter", "sugar", "bake", "dough", "spice", "simmer"]
SHARED = [
    "the", "a", "of", "and", "to", "in", "is", "was", "it", "for", "on", "with", "as", "by",
    "this", "that", "we", "they"
]


def sentence(rng: random.Random, topic: list[str]) -> str:
    return " ".join(rng.choice(topic) if rng.random() < 0.3 else rng.choice(SHARED)
                    for _ in range(rng.randint(10, 30)))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A supervised model: ``__label__hq`` space sentences, ``__label__lq`` food ones."""
    root = tmp_path_factory.mktemp("fasttext")
    rng = random.Random(0)
    lines = [f"__label__hq {sentence(rng, SPACE)}\n__label__lq {sentence(rng, FOOD)}\n"
             for _ in range(200)]
    (root / "train.txt").write_text("".join(lines), encoding="utf-8")
    trained = fasttext.train_supervised(str(root / "train.txt"), epoch=20, lr=0.5, dim=16,
                                        bucket=20_000, wordNgrams=2, thread=1, seed=1,
                                        verbose=0)
    trained.save_model(str(root / "model.bin"))
    return str(root / "model.bin")


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An empty model cache, and the paths ``fasttext.load_model`` is called with."""
    monkeypatch.setattr(fasttext_scorer, "_MODELS", {})
    calls: list[str] = []
    real = fasttext.load_model

    def counting(path: str) -> object:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(fasttext, "load_model", counting)
    return calls


def test_writes_each_label_as_a_probability(model: str) -> None:
    step = FastTextScorer(model)
    assert (step.name, step.version) == ("fasttext", "1")
    assert step.signals == {"hq": float, "lq": float}
    rng = random.Random(5)
    pos = [step(Doc(f"p{i}", sentence(rng, SPACE))) for i in range(40)]
    neg = [step(Doc(f"n{i}", sentence(rng, FOOD))) for i in range(40)]
    for doc in pos + neg:
        assert set(doc.signals) == {"hq", "lq"}
        assert 0.0 <= doc.signals["hq"] <= 1.0 and 0.0 <= doc.signals["lq"] <= 1.0
        assert doc.signals["hq"] + doc.signals["lq"] == pytest.approx(1.0, abs=1e-3)
        assert signal_type("fasttext", "hq", doc.signals["hq"]) is float
    mean = {name: sum(d.signals["hq"] for d in docs) / len(docs)
            for name, docs in (("pos", pos), ("neg", neg))}
    assert mean["pos"] > mean["neg"] + 0.5


def test_multi_line_text_empty_text_and_odd_characters_are_scored(model: str) -> None:
    step = FastTextScorer(model)
    doc = Doc("d", "galaxy orbit\ncomet nebula\n\nstellar")
    assert step(doc) is doc and doc.text == "galaxy orbit\ncomet nebula\n\nstellar"
    assert doc.signals["hq"] > 0.5
    for text in ("", "\n\n", "lone \ud800 surrogate galaxy", "tab\tand\x00nul"):
        signals = step(Doc("d", text)).signals
        assert 0.0 <= signals["hq"] <= 1.0, text


def test_labels_and_k_choose_what_is_written(model: str) -> None:
    only = FastTextScorer(model, labels=["hq"])
    assert only.signals == {"hq": float}
    assert set(only(Doc("d", "galaxy comet")).signals) == {"hq"}
    prefixed = FastTextScorer(model, labels=["__label__lq"])
    assert set(prefixed(Doc("d", "oven")).signals) == {"lq"}
    top = FastTextScorer(model, k=1)
    signals = top(Doc("d", "galaxy comet orbit")).signals
    assert signals["lq"] == 0.0 and signals["hq"] > 0.5  # outside the top k: 0.0
    with pytest.raises(ValueError, match=r"has no label 'medium' \(its labels: hq, lq\)"):
        FastTextScorer(model, labels=["medium"])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="k"):
            FastTextScorer(model, k=bad)


def test_missing_foreign_and_unsupervised_models_are_clear_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.bin"
    with pytest.raises(ValueError, match=re.escape(f"{missing}: cannot read")):
        FastTextScorer(str(missing))
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match=re.escape(f"{garbage}: not a fastText model")):
        FastTextScorer(str(garbage))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path}: is a directory")):
        FastTextScorer(str(tmp_path))
    text = tmp_path / "words.txt"
    text.write_text("galaxy orbit comet nebula stellar\n" * 50)
    vectors = fasttext.train_unsupervised(str(text), dim=4, epoch=1, minCount=1, bucket=100,
                                          thread=1, verbose=0)
    vectors.save_model(str(tmp_path / "vectors.bin"))
    with pytest.raises(ValueError, match="not a supervised fastText model"):
        FastTextScorer(str(tmp_path / "vectors.bin"))
    with pytest.raises(ValueError, match="no such file"):
        FastTextScorer("memory://no/such/model.bin")


def test_the_model_is_loaded_once_per_process(model: str, tmp_path: Path,
                                              fresh_cache: list[str]) -> None:
    steps = [FastTextScorer(model), FastTextScorer(model, labels=["hq"]), FastTextScorer(model)]
    assert fresh_cache == [model]
    assert steps[0]._model is steps[2]._model
    # a changed file (another size or mtime) is loaded again, once
    copy = tmp_path / "model.bin"
    copy.write_bytes(Path(model).read_bytes())
    FastTextScorer(str(copy))
    FastTextScorer(str(copy))
    assert fresh_cache == [model, str(copy)]
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    FastTextScorer(str(copy))
    assert fresh_cache == [model, str(copy), str(copy)]


def test_a_remote_model_is_fetched_once_to_a_temporary_file(model: str,
                                                            fresh_cache: list[str]) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/models/quality.bin", Path(model).read_bytes())
    try:
        a = FastTextScorer("memory://models/quality.bin")
        b = FastTextScorer("memory://models/quality.bin")
        assert len(fresh_cache) == 1 and a._model is b._model
        assert fresh_cache[0] != model and os.path.basename(fresh_cache[0]).endswith(
            "-quality.bin")
        assert a(Doc("d", "galaxy comet")).signals["hq"] > 0.5
        temporary = fresh_cache[0]
        fasttext_scorer._cleanup()
        assert not os.path.exists(temporary)
    finally:
        fs.rm("/models", recursive=True)


def test_a_batch_scores_as_one_document_at_a_time(model: str) -> None:
    rng = random.Random(7)
    texts = [sentence(rng, SPACE if i % 2 else FOOD) for i in range(40)]
    texts += ["", "two\nlines of the galaxy", "bad \ud800 surrogate", "日本語のテキスト"]
    step = FastTextScorer(model)
    docs = [Doc(str(i), t, {}) for i, t in enumerate(texts)]
    assert step.batch(docs) is docs
    for doc, text in zip(docs, texts, strict=True):
        assert doc.signals == step.scores(text)
    assert len({round(d.signals["hq"], 6) for d in docs}) > 10  # real, varied scores
