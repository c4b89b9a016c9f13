"""Fault tolerance and elasticity end to end, on CPU with gloo (real torchrun, real loader, real
DCP checkpoints):

* a rank SIGKILLed from outside at a random step: ``torchrun --max-restarts 1`` restarts the
  job from the last checkpoint, and the final weights are bitwise those of an uninterrupted
  run, every sample of the epoch consumed exactly once;
* a checkpoint written by 2 processes resumes on 1 and on 3 at the same global batch and
  continues the exact remaining sample sequence.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.trainer._torchrun import (
    EVERY,
    GBS,
    REPO,
    SEQ,
    Job,
    free_port,
    signal_rank_at_step,
    torchrun,
)
from trainer.metrics import read_jsonl

pytestmark = pytest.mark.slow


def trainer(args: list[str], nproc: int | None) -> subprocess.CompletedProcess[str]:
    launcher = [sys.executable] if nproc is None else torchrun(nproc, free_port())
    proc = subprocess.run([*launcher, "-m", "trainer", *args], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, f"trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}" \
                                 f"\n{proc.stderr[-5000:]}"
    return proc


def sample_records(run_dir: Path, world: int) -> dict[int, list[dict]]:
    return {r: read_jsonl(run_dir / f"rank{r}_samples.jsonl") for r in range(world)}


def epoch_counts(records: dict[int, list[dict]], epoch: int, max_step: int | None = None,
                 min_step: int = 0) -> Counter[int]:
    counts: Counter[int] = Counter()
    for recs in records.values():
        for rec in recs:
            if rec["epoch"] == epoch and min_step <= rec["step"] <= (max_step or 10**9):
                counts.update(rec["sample_ids"])
    return counts


def global_steps(records: dict[int, list[dict]]) -> dict[int, list[int]]:
    """Per step, the global batch: the sorted union of what every rank trained on."""
    out: dict[int, list[int]] = {}
    for recs in records.values():
        for rec in recs:
            out.setdefault(rec["step"], []).extend(rec["sample_ids"])
    return {step: sorted(ids) for step, ids in out.items()}


@pytest.fixture
def straight(straight_run: tuple[Path, list[str], int]) -> tuple[Path, list[str], int]:
    return straight_run


def test_sigkill_restart_is_bitwise_and_consumes_each_sample_once(
        tiny_vocab_dataset: str, straight: tuple[Path, list[str], int], tmp_path: Path) -> None:
    """Rank 1 is SIGKILLed from outside (by the test, once its sample log shows the step)."""
    from loaders import TokenDataset

    ref, common, steps = straight
    ds = TokenDataset(tiny_vocab_dataset, SEQ, rank=0, world_size=2, batch_size=GBS // 2)
    kill_at = random.randrange(EVERY + 1, steps // 2)  # after a checkpoint, well before the end
    run_dir = tmp_path / "b"
    job = Job([*torchrun(2, free_port(), max_restarts=1), "-m", "trainer", *common,
               "--run-dir", str(run_dir), "--checkpoint-dir", str(run_dir / "ck")],
              tmp_path / "job")
    try:
        signal_rank_at_step(job, run_dir, 1, kill_at, signal.SIGKILL)
        assert job.wait(240) == 0, job.tail()
    finally:
        job.kill()
    out = job.text()
    where = f"(killed at step {kill_at} or a little after, of {steps})"
    resumed = re.findall(r"resumed from \S+ at step (\d+)", out)
    assert len(resumed) == 1, out[-3000:]
    resumed_at = int(resumed[0])  # the last checkpoint complete when the kill landed
    assert resumed_at % EVERY == 0 and EVERY <= resumed_at < steps, where

    a = torch.load(ref / "model_final.pt", weights_only=True)
    b = torch.load(run_dir / "model_final.pt", weights_only=True)
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{where} weights differ: {differ}"

    # Every sample of the epoch exactly once, bar the loader's padding (at most one repeat per
    # lane, so that all ranks get as many batches); the same steps as the straight run.
    recs_a, recs_b = sample_records(ref, 2), sample_records(run_dir, 2)
    for r in (0, 1):
        assert [x["step"] for x in recs_b[r]] == list(range(1, steps + 1)), where
        assert [x["sample_ids"] for x in recs_b[r]] == [x["sample_ids"] for x in recs_a[r]]
    counts = epoch_counts(recs_b, 0)
    assert set(counts) == set(range(ds.n_samples)), where
    assert sum(counts.values()) == ds.n_samples + ds.padding, where
    assert sum(c - 1 for c in counts.values()) == ds.padding < GBS
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [s for s in range(1, steps + 1)
                                            if s % 4 == 0 or s == steps]


def test_elastic_resume_on_one_and_three_processes(tiny_vocab_dataset: str,
                                                   straight: tuple[Path, list[str], int],
                                                   tmp_path: Path) -> None:
    from loaders import Progress, TokenDataset

    ref, common, steps = straight
    at = 2 * EVERY
    plan_ds = TokenDataset(tiny_vocab_dataset, SEQ, rank=0, world_size=1, batch_size=GBS)
    n = plan_ds.n_samples
    straight_steps = global_steps(sample_records(ref, 2))
    ckpt = ref / "ck" / f"step-{at:08d}"
    assert (ckpt / "COMPLETE").exists()
    before = epoch_counts(sample_records(ref, 2), 0, max_step=at)
    assert sum(before.values()) == at * GBS

    remaining: dict[int, Counter[int]] = {}
    for world in (1, 3):
        run_dir = tmp_path / f"w{world}"
        proc = trainer([*common, "--run-dir", str(run_dir), "--resume", str(ckpt)],
                       nproc=None if world == 1 else world)
        assert f"at step {at}" in proc.stdout
        recs = sample_records(run_dir, world)
        for r in range(world):
            assert [x["step"] for x in recs[r]] == list(range(at + 1, steps + 1))
            # per-rank batch = global / world; only an epoch's last batch may be short
            short = [x["epoch"] for x in recs[r] if len(x["sample_ids"]) != GBS // world]
            assert len(short) == len(set(short)) <= 1, short
        after = epoch_counts(recs, 0)
        remaining[world] = after
        union = before + after
        assert set(union) == set(range(n)), world  # every sample of the epoch...
        assert sum(union.values()) - n == plan_ds.padding, world  # ...once, bar padding
        # Elastic determinism: every later step trains on the same global batch as the
        # uninterrupted 2-process run did at that step.
        resumed_steps = global_steps(recs)
        assert {s: resumed_steps[s] for s in resumed_steps} == {
            s: straight_steps[s] for s in range(at + 1, steps + 1)}, world

    # The same remaining samples on 1 and 3 processes; on 1, in exactly the order the plan
    # says (the rest of the epoch after 6 steps of 2 ranks x 3).
    assert set(remaining[1]) == set(remaining[3])
    one = [i for rec in read_jsonl(tmp_path / "w1" / "rank0_samples.jsonl")
           if rec["epoch"] == 0 for i in rec["sample_ids"]]
    assert one == plan_ds.rank_order(Progress(epoch=0, lane_pos=at)).tolist()
