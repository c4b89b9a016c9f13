"""Scale in and out under ``torchrun --nnodes 1:2`` (c10d rendezvous): two "nodes" on this
machine, one gloo process each. Node B leaves mid-run (its agent and worker SIGKILLed from
outside): node A's worker fails, its agent re-rendezvouses alone and the job continues on one
rank from the last checkpoint. A's worker is then paused (SIGSTOP) once it has written a
checkpoint of its own, a new node B joins, A's agent sees it waiting and restarts its worker,
and the job grows back to two ranks from that checkpoint. Every step trains on the same global
batch as the uninterrupted 2-process run (per-rank sample logs, which the trainer writes
anyway).

Lean on purpose (one process per node, the shared reference run, a tiny model): the time goes
to three process starts and to the rendezvous, whose waits are shortened by ``--rdzv-conf``
(defaults: a node is dead after 3 missed keep-alives 5 s apart, a round closes 30 s after its
minimum is there)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.pipeline._procs import wait_for
from tests.trainer._torchrun import EVERY, Job, free_port, last_step, torchrun
from trainer.metrics import read_jsonl

pytestmark = pytest.mark.slow

# A node is dead after 4 missed keep-alives 2 s apart (fewer, and an agent of a loaded machine
# that is late with one is taken for dead); a round closes 3 s after its minimum is there.
RDZV = "keep_alive_interval=2,keep_alive_max_attempt=4,last_call_timeout=3,join_timeout=120"


def node(port: int, host: bool, args: list[str], out: Path) -> Job:
    # A fresh store per rendezvous round, hosted by that round's rank 0: the agents' shared
    # store outlives rounds, and a node that joins has another restart count than the others
    # (see trainer.distributed.attempt_store).
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    cmd = torchrun(1, port, max_restarts=3, nnodes="1:2",
                   rdzv_conf=f"{RDZV},is_host={str(host).lower()}")
    return Job([*cmd, "-m", "trainer", *args], out, env=env)


def resumes(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", text)]


def test_a_node_leaves_and_joins_and_the_global_batches_stay(
        straight_run: tuple[Path, list[str], int], tmp_path: Path) -> None:
    ref, common, steps = straight_run
    run_dir = tmp_path / "run"
    args = [*common, "--run-dir", str(run_dir), "--checkpoint-dir", str(run_dir / "ck")]
    port = free_port()
    a = node(port, True, args, tmp_path / "a")
    b = node(port, False, args, tmp_path / "b")
    b2 = None
    try:
        # Both nodes train (rank 1 exists), past the first checkpoint: node B leaves.
        wait_for(lambda: last_step(run_dir / "rank1_samples.jsonl") > EVERY, 120,
                 "two ranks past the first checkpoint", interval=0.005)
        b.kill()
        # A continues alone from the last checkpoint, and saves one of its own.
        wait_for(lambda: "world size 1 " in a.text() and resumes(a.text()), 120,
                 "node A alone")
        shrunk_at = resumes(a.text())[0]
        pid = a.rank_pid(0)
        wait_for(lambda: last_step(run_dir / "rank0_samples.jsonl") > shrunk_at + EVERY, 60,
                 "a checkpoint at world size 1", interval=0.002)
        # Paused, so that the run is still going when the new node is up. Once A's agent,
        # seeing it wait, stops the worker for the new round (SIGTERM), the worker is
        # continued, so that it handles the signal now rather than at torchrun's SIGKILL 30 s
        # later.
        os.kill(pid, signal.SIGSTOP)
        a_step = last_step(run_dir / "rank0_samples.jsonl")
        assert a_step < steps, "the run ended before a node could join: make it longer"
        b2 = node(port, False, args, tmp_path / "b2")
        wait_for(lambda: f"Sending process {pid} closing signal SIGTERM" in a.text(), 120,
                 "node A's agent to restart its worker for the new node")
        os.kill(pid, signal.SIGCONT)
        assert a.wait(180) == 0, a.tail()
        assert b2.wait(60) == 0, b2.tail()
    finally:
        for job in (a, b, b2):
            if job is not None:
                job.kill()
    text = a.text() + b2.text()
    grown_at = resumes(text)[-1]
    assert EVERY <= shrunk_at < grown_at <= a_step, (shrunk_at, grown_at, a_step)
    assert len(re.findall(r"world size 1 ", text)) == 1, text[-3000:]

    # Who trained each step: two ranks, then one (from the checkpoint before B left), then two
    # again (from the checkpoint written at world size 1).
    recs = {r: read_jsonl(run_dir / f"rank{r}_samples.jsonl") for r in (0, 1)}
    ranks_at: dict[int, int] = {}
    got: dict[int, list[int]] = {}
    for rs in recs.values():
        for rec in rs:
            ranks_at[rec["step"]] = ranks_at.get(rec["step"], 0) + 1
            got.setdefault(rec["step"], []).extend(rec["sample_ids"])
    assert sorted(ranks_at) == list(range(1, steps + 1))
    assert [ranks_at[s] for s in range(1, steps + 1)] == \
        [2] * shrunk_at + [1] * (grown_at - shrunk_at) + [2] * (steps - grown_at)
    # The same global batch at every step as the uninterrupted 2-process run.
    want: dict[int, list[int]] = {}
    for r in (0, 1):
        for rec in read_jsonl(ref / f"rank{r}_samples.jsonl"):
            want.setdefault(rec["step"], []).extend(rec["sample_ids"])
    assert {s: sorted(v) for s, v in got.items()} == {s: sorted(v) for s, v in want.items()}
