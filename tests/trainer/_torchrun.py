"""Trainer jobs under real torchrun agents, and faults injected into them from outside: a rank
is found by the ``RANK`` in its environment among the agent's children, and signalled
(SIGKILL, SIGSTOP) once its sample log (``rank<r>_samples.jsonl``, written by the trainer
anyway, one line per step before the step's compute) shows the step wanted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.pipeline._procs import kill_tree, wait_for

REPO = Path(__file__).resolve().parents[2]

#: The shape every fault test shares with the ``straight_run`` fixture (conftest): a 1x32
#: model, sequences of 64, a global batch of 6 (divisible by 1, 2 and 3 processes), a
#: checkpoint every 3 steps.
SEQ, GBS, EVERY = 64, 6, 3
MODEL = ["--layers", "1", "--width", "32", "--heads", "2", "--seq-len", str(SEQ),
         "--device", "cpu", "--lr", "3e-3", "--warmup-steps", "2", "--log-every", "4"]


#: one thread per process: two ranks and the test runner share two cores
TRAINER_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_trainer(argv: list[str], nproc: int | None = None,
                timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m trainer argv`` (under torchrun with ``nproc`` processes when given), which
    must succeed: its output's tail is the failure message otherwise."""
    launcher = [*torchrun(nproc, free_port())] if nproc else [sys.executable]
    proc = subprocess.run([*launcher, "-m", "trainer", *argv], cwd=REPO, env=TRAINER_ENV,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, port: int, *, max_restarts: int = 0, nnodes: str | None = None,
             rdzv_conf: str | None = None) -> list[str]:
    """``python -m torch.distributed.run`` with the c10d rendezvous (in torch 2.13 a restart
    under the static rendezvous hands the new workers stale gloo addresses of the killed
    ones)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "--max-restarts", str(max_restarts), "--monitor-interval", "0.2"]
    if nnodes is not None:
        cmd += ["--nnodes", nnodes, "--rdzv-id", "elastic"]
    if rdzv_conf is not None:
        cmd += ["--rdzv-conf", rdzv_conf]
    return cmd


class Job:
    """A launched job (torchrun or a plain process) with its output in files, so that a test
    can watch the log while it runs."""

    def __init__(self, cmd: list[str], out: Path, env: dict[str, str] | None = None) -> None:
        self.out = out
        self.stdout, self.stderr = out.with_suffix(".out"), out.with_suffix(".err")
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        with open(self.stdout, "w") as o, open(self.stderr, "w") as e:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=o, stderr=e,
                                         start_new_session=True)

    def text(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job did not end in {timeout} s:\n{self.tail()}") from None

    def kill(self) -> None:
        kill_tree(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def tail(self, n: int = 6000) -> str:
        return self.text()[-n:]

    def rank_pid(self, rank: int, timeout: float = 60) -> int:
        """The pid of the worker with ``RANK=rank`` among this job's processes."""
        found: list[int] = []

        def look() -> bool:
            with contextlib.suppress(psutil.NoSuchProcess):
                for p in psutil.Process(self.proc.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if p.environ().get("RANK") == str(rank) and "trainer" in p.cmdline():
                            found.append(p.pid)
                            return True
            assert self.proc.poll() is None, f"job ended:\n{self.tail()}"
            return False

        wait_for(look, timeout, f"rank {rank}'s process")
        return found[0]


def last_step(path: Path) -> int:
    """The last step a sample log records (0 when it has none yet)."""
    if not path.exists():
        return 0
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    for line in reversed(lines):
        with contextlib.suppress(json.JSONDecodeError):
            return int(json.loads(line)["step"])
    return 0


def wait_for_step(job: Job, run_dir: Path, rank: int, step: int, timeout: float = 120) -> None:
    path = run_dir / f"rank{rank}_samples.jsonl"

    def reached() -> bool:
        assert job.proc.poll() is None, f"job ended before step {step}:\n{job.tail()}"
        return last_step(path) >= step

    wait_for(reached, timeout, f"rank {rank} at step {step}", interval=0.005)


def signal_rank_at_step(job: Job, run_dir: Path, rank: int, step: int,
                        sig: signal.Signals) -> float:
    """Send ``sig`` to rank ``rank`` once it starts step ``step``; returns when (monotonic)."""
    pid = job.rank_pid(rank)
    wait_for_step(job, run_dir, rank, step)
    os.kill(pid, sig)
    return time.monotonic()
