"""Fault tolerance and elasticity end to end, on CPU with gloo (real torchrun, real loader, real
DCP checkpoints):

* a rank SIGKILLed at a random step: ``torchrun --max-restarts 1`` restarts the job from the
  last checkpoint, and the final weights are bitwise those of an uninterrupted run, every
  sample of the epoch consumed exactly once;
* a checkpoint written by 2 processes resumes on 1 and on 3 at the same global batch and
  continues the exact remaining sample sequence.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from trainer.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]
SEQ = 64
MODEL = ["--layers", "1", "--width", "32", "--heads", "2", "--seq-len", str(SEQ),
         "--device", "cpu", "--lr", "3e-3", "--warmup-steps", "2", "--log-every", "4"]

pytestmark = pytest.mark.slow


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer(args: list[str], nproc: int | None, *, max_restarts: int = 0,
            env: dict[str, str] | None = None, timeout: float = 240
            ) -> subprocess.CompletedProcess[str]:
    launcher = [sys.executable]
    if nproc is not None:
        # The c10d rendezvous, not the static one: in torch 2.13 a restart under the static
        # rendezvous hands the new workers stale gloo addresses of the killed ones.
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                     "--max-restarts", str(max_restarts), "--monitor-interval", "0.5"]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run([*launcher, "-m", "trainer", *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
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


GBS = 6  # divisible by 1, 2 and 3 processes
EVERY = 3


@pytest.fixture(scope="module")
def straight(tiny_vocab_dataset: str, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, list[str], int]:
    """One uninterrupted 2-process run (one epoch and 2 steps, a checkpoint every 3 steps, all
    kept): the reference for the killed run and the source of the elastic resumes."""
    from loaders import TokenDataset

    ds = TokenDataset(tiny_vocab_dataset, SEQ, rank=0, world_size=2, batch_size=GBS // 2)
    steps = -(-len(ds) // (GBS // 2)) + 2
    common = ["--data", tiny_vocab_dataset, "--steps", str(steps), "--global-batch-size",
              str(GBS), "--checkpoint-every", str(EVERY), "--keep", "100", "--deterministic",
              *MODEL]
    run_dir = tmp_path_factory.mktemp("straight")
    trainer([*common, "--run-dir", str(run_dir), "--checkpoint-dir", str(run_dir / "ck")],
            nproc=2)
    return run_dir, common, steps


def test_sigkill_restart_is_bitwise_and_consumes_each_sample_once(
        tiny_vocab_dataset: str, straight: tuple[Path, list[str], int], tmp_path: Path) -> None:
    from loaders import TokenDataset

    ref, common, steps = straight
    ds = TokenDataset(tiny_vocab_dataset, SEQ, rank=0, world_size=2, batch_size=GBS // 2)
    kill_at = random.randrange(EVERY + 1, steps - 1)  # after a checkpoint, before the end
    proc = trainer([*common, "--run-dir", str(tmp_path / "b"), "--checkpoint-dir",
                    str(tmp_path / "b" / "ck")], nproc=2, max_restarts=1,
                   env={"SHARDFLOW_TEST_KILL_AT_STEP": str(kill_at),
                        "SHARDFLOW_TEST_KILL_RANK": "1"})
    where = f"(killed at step {kill_at} of {steps})"
    assert (tmp_path / "b" / f".test-killed-rank1-step{kill_at}").exists(), where
    resumed_at = (kill_at - 1) // EVERY * EVERY  # the kill comes before step kill_at is saved
    assert f"step-{resumed_at:08d} at step {resumed_at}" in proc.stdout, proc.stdout[-3000:]

    a = torch.load(ref / "model_final.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model_final.pt", weights_only=True)
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{where} weights differ: {differ}"

    # Every sample of the epoch exactly once, bar the loader's padding (at most one repeat per
    # lane, so that all ranks get as many batches); the same steps as the straight run.
    recs_a, recs_b = sample_records(ref, 2), sample_records(tmp_path / "b", 2)
    for r in (0, 1):
        assert [x["step"] for x in recs_b[r]] == list(range(1, steps + 1)), where
        assert [x["sample_ids"] for x in recs_b[r]] == [x["sample_ids"] for x in recs_a[r]]
    counts = epoch_counts(recs_b, 0)
    assert set(counts) == set(range(ds.n_samples)), where
    assert sum(counts.values()) == ds.n_samples + ds.padding, where
    assert sum(c - 1 for c in counts.values()) == ds.padding < GBS
    metrics = read_jsonl(tmp_path / "b" / "metrics.jsonl")
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
