"""User steps through ``python -m pipeline run`` on a real Dask cluster: a recipe file with a
step from a module on the workers' path adds its columns and its drops (``stats.dropped``
under the step's name), the documents it raises on are quarantined with its name and the run
commits; a fastText model trained by ``train-classifier`` scores every document as a column;
a changed step version redoes the partitions, an unchanged one reuses them; a step no worker
can import stops the run with one line naming it and the worker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.pipeline.steps.test_train_classifier import ASTRONOMY, COOKING, SMALL, make_docs

REPO = Path(__file__).resolve().parents[3]

STEP_MODULE = '''
import multiprocessing


class Tagger:
    """Counts 'galaxy', drops one-line documents about ovens, raises on 'explode'."""

    name = "tagger"
    version = "{version}"

    def __init__(self, word="galaxy"):
        self.word = word

    def __call__(self, doc):
        words = doc.text.lower().replace(".", " ").split()
        doc.signals["count"] = words.count(self.word)
        doc.signals["topic"] = "space" if self.word in words else "other"
        if "explode" in words:
            raise RuntimeError("asked to explode")
        if "oven" in words and "\\n" not in doc.text:
            return None, "oven"
        return doc


'''


SHY_MODULE = '''
import multiprocessing


class WorkerShy:
    """Imports in the driver, not on a Dask worker (as a module missing from a worker)."""

    name = "shy"
    version = "1"

    def __call__(self, doc):
        return doc


if "Dask Worker" in multiprocessing.current_process().name:
    raise ImportError("this module is not installed on the workers")
'''


def _write_inputs(root: Path) -> list[str]:
    docs = make_docs(ASTRONOMY, 60, seed=11) + make_docs(COOKING, 60, seed=12)
    docs.insert(7, "Please explode now, galaxy.")
    a = [json.dumps({"text": d}) for d in docs[:60]]
    b = [json.dumps({"text": d}) for d in docs[60:]]
    (root / "a.jsonl").write_text("\n".join(a) + "\n")
    (root / "b.jsonl").write_text("\n".join(b) + "\n")
    return [str(root / "a.jsonl"), str(root / "b.jsonl")]


def _model(root: Path) -> str:
    from pipeline.steps.train_classifier import train_classifier
    from tests.pipeline.steps.test_train_classifier import write_jsonl

    pos = write_jsonl(root / "pos.jsonl", make_docs(ASTRONOMY, 200, seed=1))
    neg = write_jsonl(root / "neg.jsonl", make_docs(COOKING, 200, seed=2))
    train_classifier([pos], [neg], str(root / "model.bin"), **SMALL)
    return str(root / "model.bin")


def _recipe(root: Path, model: str, tagger: str = "mysteps:Tagger") -> Path:
    path = root / "recipe.toml"
    path.write_text(f'[[steps]]\nuse = "clean"\n\n[[steps]]\nuse = "{tagger}"\nname = "tag"\n'
                    f'\n[[steps]]\nuse = "fasttext"\nname = "quality"\nmodel = "{model}"\n')
    return path


def _run(root: Path, recipe: Path, inputs: list[str], version: str = "1"
         ) -> subprocess.CompletedProcess[str]:
    (root / "mysteps.py").write_text(STEP_MODULE.format(version=version))
    (root / "shysteps.py").write_text(SHY_MODULE)
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{REPO}"}
    return subprocess.run([sys.executable, "-m", "pipeline", "run", "--no-progress",
                           "--config", str(recipe), "--output", str(root / "ds"),
                           "--workers", "2", "--files-per-partition", "1", *inputs],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], str]:
    root = tmp_path_factory.mktemp("user-steps")
    return root, _write_inputs(root), _model(root)


def test_a_user_step_and_a_model_scorer_add_columns_drops_and_quarantine(
        setup: tuple[Path, list[str], str]) -> None:
    root, inputs, model = setup
    out = _run(root, _recipe(root, model), inputs)
    assert out.returncode == 0, out.stderr[-3000:]
    manifest = json.loads((root / "ds" / "manifest.json").read_text())
    stats = manifest["stats"]
    assert stats["dropped"].get("tag.oven", 0) >= 1
    assert stats["quarantined"] == {"tag.error": 1}
    assert stats["signals"] == {
        "tag.count": {"type": "int64", "step": "tag"},
        "tag.topic": {"type": "string", "step": "tag"},
        "quality.hq": {"type": "double", "step": "quality"},
        "quality.lq": {"type": "double", "step": "quality"}}
    assert [(s["use"], s["version"]) for s in manifest["config"]["steps"]] == [
        ("clean", "1"), ("mysteps:Tagger", "1"), ("fasttext", "1")]
    quarantine = "".join(p.read_text() for p in (root / "ds" / "quarantine").iterdir())
    record = json.loads(quarantine.splitlines()[0])
    assert record["reason"] == "tag.error" and "asked to explode" in record["detail"]
    assert re.match(r"a\.jsonl:\d+$", record["source"])
    rows = [pq.read_table(p).to_pylist() for p in sorted((root / "ds" / "shards").iterdir())]
    rows = [r for shard in rows for r in shard]
    assert len(rows) == stats["documents_out"]
    space = [r["quality.hq"] for r in rows if r["tag.topic"] == "space"]
    other = [r["quality.hq"] for r in rows if r["tag.topic"] == "other"]
    assert space and other and np.mean(space) > np.mean(other) + 0.5
    assert all(0 <= r["quality.hq"] <= 1 for r in rows)


def test_a_step_version_keys_the_partitions(setup: tuple[Path, list[str], str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's partition keys hash its manifest config (``pipeline.driver.job``: the salt), which
    holds each step's version: an interrupted run resumed with the same steps finds its
    finished partitions under the same keys; a changed step gets new keys, so its
    partitions are redone."""
    import importlib

    from pipeline.cli import config_from_argv
    from pipeline.planning.plan import PartitionPlan

    root, inputs, model = setup
    recipe = _recipe(root, model)
    monkeypatch.syspath_prepend(str(root))

    def keys(version: str) -> list[str]:
        (root / "mysteps.py").write_text(STEP_MODULE.format(version=version))
        sys.modules.pop("mysteps", None)
        importlib.invalidate_caches()
        cfg = config_from_argv(["--config", str(recipe), "--files-per-partition", "1",
                                *inputs])
        from pipeline.planning.discovery import discover_table

        plan = PartitionPlan(discover_table(inputs, None, None), 1 << 20, 1)
        return list(plan.keys(json.dumps([cfg.for_manifest(), "tokenizer"], sort_keys=True)))

    first = keys("1")
    assert len(first) == 2 and keys("1") == first
    assert not set(keys("2")) & set(first)


def test_a_step_no_worker_can_import_stops_the_run_naming_it(
        setup: tuple[Path, list[str], str], tmp_path: Path) -> None:
    root, inputs, model = setup
    recipe = tmp_path / "shy.toml"
    recipe.write_text('[[steps]]\nuse = "shysteps:WorkerShy"\n')
    out = _run(root, recipe, inputs)
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in out.stderr
    assert re.search(r"worker tcp://127\.0\.0\.1:\d+: step 'shysteps:WorkerShy': cannot import "
                     r"'shysteps' \(ImportError: this module is not installed", errors[0])
