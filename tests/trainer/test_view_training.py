"""The trainer on a view (``python -m pipeline select``), as the issue's "done when" asks: a
run of two ranks under torchrun to a checkpoint, resumed on one process, trains every step on
the samples of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.select.build import select
from storage import ReplicaSet
from tests.pipeline.select import web_views
from tests.trainer._torchrun import run_trainer
from trainer.metrics import read_jsonl

MODEL = ["--layers", "1", "--width", "16", "--heads", "2", "--seq-len", "32", "--device",
         "cpu", "--global-batch-size", "8", "--warmup-steps", "1", "--lr", "3e-3",
         "--log-every", "4", "--deterministic"]
STEPS, CHECKPOINT = 8, 4


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("train-view")
    web = web_views.build(root, shared=tmp_path_factory)
    select(ReplicaSet.from_urls([str(web)]), "lang = 'en'",
           ReplicaSet.from_urls([str(root / "web-en")]), progress=False)
    return str(root / "web-en")


def _by_step(path: Path) -> dict[int, list[int]]:
    return {r["step"]: r["sample_ids"] for r in read_jsonl(path)}


def test_a_view_trains_and_resumes_on_another_world_size_on_the_same_batches(
        view: str, tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    run_trainer(["--data", view, "--steps", str(STEPS), "--run-dir", str(straight), *MODEL])
    want = _by_step(straight / "rank0_samples.jsonl")
    assert sorted(want) == list(range(1, STEPS + 1))
    run_dir, ck = tmp_path / "run", tmp_path / "ck"
    common = ["--data", view, "--run-dir", str(run_dir), "--checkpoint-dir", str(ck),
              "--checkpoint-every", str(CHECKPOINT), *MODEL]
    run_trainer([*common, "--steps", str(CHECKPOINT)], nproc=2)
    proc = run_trainer([*common, "--steps", str(STEPS)])
    assert f"at step {CHECKPOINT}" in proc.stdout
    r0, r1 = _by_step(run_dir / "rank0_samples.jsonl"), _by_step(run_dir / "rank1_samples.jsonl")
    assert sorted(r1) == list(range(1, CHECKPOINT + 1))
    assert {s: r0[s] + r1.get(s, []) for s in r0} == want
