"""The load-imbalance report end to end: ``python -m trainer`` under torchrun (2 processes,
gloo), one rank slowed from outside its process (SIGSTOP/SIGCONT pulses sent by the test, as
a throttled or descheduled host would), named by the report within two intervals."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainer.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]
EVERY = 20

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reports(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    try:
        return [r for r in read_jsonl(path) if r.get("kind") == "imbalance"]
    except ValueError:  # a line being written
        return []


def rank_process(launcher: psutil.Process, rank: int) -> psutil.Process:
    for child in launcher.children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
    raise LookupError(f"no process of rank {rank}")


def test_a_rank_slowed_from_outside_is_named_within_two_reports(
        tiny_vocab_dataset: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = (tmp_path / "out.log").open("w")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
           "-m", "trainer", "--data", tiny_vocab_dataset, "--steps", "100000",
           "--layers", "1", "--width", "32", "--heads", "2", "--seq-len", "64",
           "--batch-size", "4", "--device", "cpu", "--log-every", str(EVERY),
           "--imbalance-every", str(EVERY), "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=log, stderr=subprocess.STDOUT)
    victim = None
    try:
        deadline = time.monotonic() + 120
        while len(reports(run_dir)) < 1:  # training is under way
            assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no imbalance report in 120 s"
            time.sleep(0.05)
        victim = rank_process(psutil.Process(proc.pid), 1)
        before = len(reports(run_dir))
        # rank 1 runs ~12 ms out of every ~52, at random phases (fixed periods could lock
        # onto the step and stop it always in the same phase)
        rng = random.Random(0)
        while len(reports(run_dir)) < before + 3:
            assert proc.poll() is None and time.monotonic() < deadline
            victim.send_signal(signal.SIGSTOP)
            time.sleep(rng.uniform(0.02, 0.06))
            victim.send_signal(signal.SIGCONT)
            time.sleep(rng.uniform(0.004, 0.02))
    finally:
        if victim is not None:
            victim.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    got = reports(run_dir)
    after = got[before:]  # the first of these may have begun before the pulses did
    assert len(after) >= 2
    assert after[1]["slowest_rank"] == 1, [(r["step"], r["slowest_rank"], r["spread_pct"])
                                           for r in got]
    assert after[1]["spread_pct"] > 20, after[1]
    assert {"data_s", "compute_s", "optimizer_s", "collective_s", "scores"} <= after[1].keys()
    # rank 0 waits for rank 1 at the gradient all-reduce; rank 1 hardly waits for rank 0
    assert after[1]["collective_s"][0] > after[1]["collective_s"][1], after[1]
    out = (tmp_path / "out.log").read_text()
    assert f"imbalance @ step {after[1]['step']}: slowest rank 1" in out
