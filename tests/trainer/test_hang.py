"""Hang detection end to end (real torchrun, gloo, the real loader and DCP checkpoints): rank 1
is SIGSTOPped from outside mid-run; the heartbeat names it within the timeout, its stack is
dumped, the job exits and ``torchrun --max-restarts 1`` restarts it from the last checkpoint;
the final weights are bitwise those of the uninterrupted run."""

from __future__ import annotations

import random
import re
import signal
import socket
import time
from pathlib import Path

import pytest
import torch

from tests.pipeline._procs import wait_for
from tests.trainer._torchrun import (
    EVERY,
    Job,
    free_port,
    last_step,
    signal_rank_at_step,
    torchrun,
)
from trainer.heartbeat import HANG_EXIT_CODE, IO_PHASES
from trainer.metrics import read_jsonl

pytestmark = pytest.mark.slow

TIMEOUT = 5.0
TIMEOUT_IO = 30.0


def test_sigstopped_rank_is_named_dumped_and_the_job_restarts_bitwise(
        straight_run: tuple[Path, list[str], int], tmp_path: Path) -> None:
    ref, common, steps = straight_run
    # Right after a checkpoint (so that the job has one to restart from) and, as a rule, out
    # of the save, whose longer limit would make the test wait for it. The stop lands where
    # the rank is when this process sees the step in its sample log: on a loaded host that
    # can be a few steps later, up to the next save (1 run in ~7 here at load 10, with an
    # extra busy process): the verdict is then, rightly, 'save' under the I/O limit.
    stop_at = random.choice(range(EVERY + 1, steps // 2, EVERY))
    run_dir = tmp_path / "hung"
    job = Job([*torchrun(2, free_port(), max_restarts=1), "-m", "trainer", *common,
               "--run-dir", str(run_dir), "--checkpoint-dir", str(run_dir / "ck"),
               "--hang-timeout", str(TIMEOUT), "--hang-timeout-io", str(TIMEOUT_IO)],
              tmp_path / "job")
    try:
        stopped = signal_rank_at_step(job, run_dir, 1, stop_at, signal.SIGSTOP)
        # Where it stopped: its sample log's last step (the log cannot move while stopped).
        logged = last_step(run_dir / "rank1_samples.jsonl")
        wait_for(lambda: "trainer: hang: rank 1 " in job.text(), 60, "the hang report",
                 interval=0.05)
        detected_s = time.monotonic() - stopped
        assert job.wait(240) == 0, job.tail()
    finally:
        job.kill()
    out = job.text()
    where = (f"(stopped at step {stop_at} of {steps}, its log at step {logged}, detected "
             f"after {detected_s:.1f} s)")

    # One report, naming the rank, its host and its last phase, within the timeout (plus the
    # watcher's tick and the loaded machine's slack) and not before it.
    reports = re.findall(r"trainer: hang: rank (\d+) on host (\S+) \(pid \d+\) made no progress "
                         r"for ([\d.]+) s, last phase '([\w-]+)' at step (\d+); its process "
                         r"does not respond", out)
    assert len(reports) == 1, out[-4000:]
    rank, host, idle, phase, step = reports[0]
    assert (rank, host) == ("1", socket.gethostname()), where
    # The record is the last one published: its step may lag the sample log by a tick, or
    # lead it by one (the step's 'data' beat comes before its sample record).
    assert EVERY < int(step) <= logged + 1, (reports, where)
    if phase in IO_PHASES:  # stopped in a save: only a step that saves, its log there
        assert phase == "save" and int(step) == logged and logged % EVERY == 0, \
            (reports, where)
    else:
        assert phase in ("data", "step"), (reports, where)
    limit = TIMEOUT_IO if phase in IO_PHASES else TIMEOUT
    # the slack is a loaded machine's (a few s idle), yet below the I/O limit for a step: a
    # step's hang judged by the I/O limit would still fail it
    assert float(idle) >= limit and detected_s < limit + 4 * TIMEOUT, (reports, where)
    # The stopped rank's stack, dumped by its own sidecar once continued (SIGCONT only).
    assert "is stopped (SIGSTOP or a debugger)" in out, out[-4000:]
    assert "trainer: hang: stack of rank 1 (pid" in out, out[-4000:]
    assert "most recent call first" in out and "trainer/train.py" in out, out[-4000:]
    assert f"exitcode: {HANG_EXIT_CODE}" in out, out[-4000:]

    # Restarted from the last checkpoint (it is the resume's only line), bitwise the same.
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", out)]
    assert len(resumed) == 1 and resumed[0] % EVERY == 0 and resumed[0] <= int(step), where
    a = torch.load(ref / "model_final.pt", weights_only=True)
    b = torch.load(run_dir / "model_final.pt", weights_only=True)
    assert [k for k in a if not torch.equal(a[k], b[k])] == [], where
    for r in (0, 1):
        got = read_jsonl(run_dir / f"rank{r}_samples.jsonl")
        assert [x["step"] for x in got] == list(range(1, steps + 1)), where
        want = read_jsonl(ref / f"rank{r}_samples.jsonl")
        assert [x["sample_ids"] for x in got] == [x["sample_ids"] for x in want], where
