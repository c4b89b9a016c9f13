"""train_classifier: two document sets the test makes (astronomy vs cooking sentences over
shared filler words), read as ``pipeline run`` reads them, a model that separates documents
it never trained on, the numbers it reports, and the ``train-classifier`` command."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from infra.config import make_app, parse
from pipeline.records import Document
from pipeline.steps.contract import Doc
from pipeline.steps.fasttext_scorer import FastTextScorer
from pipeline.steps.train_classifier import (
    _text_of,
    fasttext_line,
    main,
    precision_recall,
    read_texts,
    register,
    roc_auc,
    split,
    train_classifier,
)

ASTRONOMY = [
    "galaxy", "telescope", "orbit", "planet", "comet", "nebula", "stellar", "quasar", "cosmic",
    "asteroid", "eclipse", "meteor", "lunar", "solar", "gravity"
]
COOKING = [
    "recipe", "kitchen", "flour", "oven", "butter", "sugar", "bake", "dough", "spice", "simmer",
    "garlic", "onion", "roast", "pastry", "sauce"
]
SHARED = [
    "the", "a", "of", "and", "to", "in", "is", "was", "it", "for", "on", "with", "as", "by",
    "this", "that", "we", "they", "very", "some", "many", "new", "old", "good", "time", "day",
    "people"
]
#: small models: the defaults (bucket 2,000,000 x dim 100) would write 800 MB per model
SMALL = {"dim": 16, "bucket": 20_000, "epochs": 20, "lr": 0.5}


def make_docs(topic: list[str], n: int, seed: int) -> list[str]:
    """``n`` documents of a few lines, a quarter of their words from ``topic``."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        lines = []
        for _ in range(rng.randint(1, 3)):
            words = [rng.choice(topic) if rng.random() < 0.25 else rng.choice(SHARED)
                     for _ in range(rng.randint(8, 25))]
            lines.append(" ".join(words).capitalize() + ".")
        docs.append("\n".join(lines))
    return docs


def write_jsonl(path: Path, docs: list[str]) -> str:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(positive glob, negative file): 300 astronomy documents in two files, 300 cooking."""
    root = tmp_path_factory.mktemp("sets")
    pos = make_docs(ASTRONOMY, 300, seed=1)
    write_jsonl(root / "pos-1.jsonl", pos[:150])
    write_jsonl(root / "pos-2.jsonl", pos[150:])
    neg = write_jsonl(root / "neg.jsonl", make_docs(COOKING, 300, seed=2))
    return str(root / "pos-*.jsonl"), neg


@pytest.fixture(scope="module")
def trained(sets: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, object]:
    out = tmp_path_factory.mktemp("model") / "quality.bin"
    return train_classifier([sets[0]], [sets[1]], str(out), seed=7, **SMALL)


def test_held_out_documents_are_separated(trained: dict[str, object]) -> None:
    assert trained["auc"] is not None and trained["auc"] >= 0.9
    assert trained["precision"] >= 0.8 and trained["recall"] >= 0.8
    assert trained["documents"] == {"hq": 300, "lq": 300}
    assert trained["holdout"] == {"hq": 30, "lq": 30}
    assert trained["train"] == {"hq": 270, "lq": 270}
    assert trained["params"]["word_ngrams"] == 2 and trained["params"]["seed"] == 7
    assert Path(str(trained["model"])).is_file()


def test_the_step_scores_new_documents_of_each_set(trained: dict[str, object]) -> None:
    """Documents made afresh (other seeds): never seen in training."""
    step = FastTextScorer(str(trained["model"]))
    pos = [step(Doc(str(i), t)).signals["hq"] for i, t in enumerate(make_docs(ASTRONOMY, 60, 11))]
    neg = [step(Doc(str(i), t)).signals["hq"] for i, t in enumerate(make_docs(COOKING, 60, 12))]
    assert all(0.0 <= s <= 1.0 for s in pos + neg)
    assert np.mean(pos) > np.mean(neg) + 0.5
    auc = roc_auc(np.array(pos + neg), np.array([True] * 60 + [False] * 60))
    assert auc is not None and auc >= 0.9


def test_same_seed_same_model(sets: tuple[str, str], tmp_path: Path) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    ra = train_classifier([sets[0]], [sets[1]], str(a), seed=3, max_docs=80, **SMALL)
    rb = train_classifier([sets[0]], [sets[1]], str(b), seed=3, max_docs=80, **SMALL)
    assert a.read_bytes() == b.read_bytes()
    assert ra["auc"] == rb["auc"]
    assert ra["documents"] == {"hq": 80, "lq": 80} and ra["holdout"] == {"hq": 8, "lq": 8}


def test_split_is_stratified_disjoint_and_seeded() -> None:
    labels = np.array([1] * 50 + [0] * 30, dtype=np.int8)
    order, held = split(labels, 0.2, seed=5)
    assert sorted(order.tolist() + held.tolist()) == list(range(80))
    assert int((labels[held] == 1).sum()) == 10 and int((labels[held] == 0).sum()) == 6
    again = split(labels, 0.2, seed=5)
    assert np.array_equal(order, again[0]) and np.array_equal(held, again[1])
    assert not np.array_equal(order, split(labels, 0.2, seed=6)[0])
    # one document of a class is never all held out; holdout 0 holds nothing out
    assert split(np.array([1, 0], dtype=np.int8), 0.9, 0)[1].size == 0
    assert split(labels, 0.0, 0)[1].size == 0


def test_roc_auc_and_precision_recall_by_hand() -> None:
    y = np.array([True, True, False, False])
    assert roc_auc(np.array([0.9, 0.8, 0.2, 0.1]), y) == 1.0
    assert roc_auc(np.array([0.1, 0.2, 0.8, 0.9]), y) == 0.0
    # pairs (pos, neg): (0.9,0.5) win, (0.9,0.1) win, (0.5,0.5) tie, (0.5,0.1) win: 3.5 / 4
    assert roc_auc(np.array([0.9, 0.5, 0.5, 0.1]), y) == pytest.approx(0.875)
    assert roc_auc(np.array([0.3, 0.4]), np.array([True, True])) is None
    p, r = precision_recall(np.array([0.9, 0.4, 0.6, 0.1]), y)
    assert (p, r) == (0.5, 0.5)
    assert precision_recall(np.array([0.1, 0.2]), np.array([True, False])) == (None, 0.0)


def test_one_line_per_document_and_no_injected_labels() -> None:
    line = fasttext_line("hq", "first line\nsecond\r\nthird __label__lq x")
    assert line == b"__label__hq first line second  third   x\n"
    assert line.count(b"\n") == 1


def test_records_are_read_as_the_run_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"text": "a good document"}\nnot json at all\n{"text": "   "}\n'
                    '{"body": "another"}\n', encoding="utf-8")
    skipped: Counter[str] = Counter()
    assert list(read_texts([str(path)], None, skipped)) == ["a good document"]
    assert skipped["rejected"] == 2 and skipped["empty"] == 1
    assert list(read_texts([str(path)], None, Counter(), text_field="body")) == ["another"]


def test_html_becomes_its_main_text_and_other_records_are_left_out() -> None:
    skipped: Counter[str] = Counter()
    html = ("<html><head><title>t</title></head><body><article><p>Main text of the page, "
            "long enough to be content.</p></article></body></html>")
    text = _text_of(Document("d", html, kind="html"), skipped)
    assert text is not None and "Main text of the page" in text and "<p>" not in text
    assert _text_of(Document("d", "%PDF-1.4", kind="other:application/pdf"), skipped) is None
    assert skipped == {"not_html": 1}


def test_bad_arguments_are_clear_errors(sets: tuple[str, str], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no documents in the negative inputs"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text('{"text": ""}\n')
        train_classifier([sets[0]], [str(empty)], str(tmp_path / "m.bin"), **SMALL)
    with pytest.raises(ValueError, match="no input files match"):
        train_classifier([str(tmp_path / "none-*.jsonl")], [sets[1]], str(tmp_path / "m.bin"))
    with pytest.raises(ValueError, match="is a directory"):
        train_classifier([sets[0]], [sets[1]], str(tmp_path))
    with pytest.raises(ValueError, match="a local path"):
        train_classifier([sets[0]], [sets[1]], "s3://bucket/model.bin")
    with pytest.raises(ValueError, match="holdout"):
        train_classifier([sets[0]], [sets[1]], str(tmp_path / "m.bin"), holdout=1.0)


def test_register_adds_train_classifier(sets: tuple[str, str], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    app = make_app("python -m pipeline", help="test app", component="pipeline")
    register(app)
    model = tmp_path / "cli" / "model.bin"
    command, bound = parse(app, [
        "train-classifier", "--positive", sets[0], "--negative", sets[1],
        "--output", str(model), "--epochs", "10", "--seed", "4", "--dim", "16",
        "--bucket", "20000", "--storage-options", "{}"])
    assert command(*bound.args, **bound.kwargs) == 0
    report = json.loads(Path(f"{model}.json").read_text())
    assert report["auc"] >= 0.9 and report["params"]["seed"] == 4
    assert report["params"]["epochs"] == 10 and model.is_file()
    out = capsys.readouterr()
    assert "roc auc" in out.out and "precision" in out.out
    assert "positive: 300 documents" in out.err and "negative: 300 documents" in out.err


def test_help_and_flags_only(monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--positive", "--negative", "--output", "--storage-options", "--epochs",
                 "--seed"):
        assert flag in text
    # run's SHARDFLOW_PIPELINE_OUTPUT is not the model's path
    monkeypatch.setenv("SHARDFLOW_PIPELINE_OUTPUT", "/tmp/not-a-model")
    with pytest.raises(SystemExit) as stop:
        main(["--positive", "a.jsonl", "--negative", "b.jsonl"])
    assert stop.value.code == 2
    assert "--output" in capsys.readouterr().err


def test_main_reports_errors_in_one_line(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--positive", str(tmp_path / "none.jsonl"), "--negative", "x.jsonl",
               "--output", str(tmp_path / "m.bin")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "none.jsonl" in err[0]
