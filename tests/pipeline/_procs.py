"""Helpers for tests that start and kill real processes: Dask scheduler/workers, the CLI."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from pipeline.driver.cluster import worker_env

REPO = Path(__file__).resolve().parents[2]
#: what the LocalCluster gives its workers, for separately started ones too
ENV = {**os.environ, **worker_env(1), "PYTHONPATH": str(REPO)}


def pipeline_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "run", "--no-progress",
            "--dashboard-address", "127.0.0.1:0", *args]


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant, each by its own pid."""
    try:
        proc = psutil.Process(pid)
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(family, timeout=10)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.02) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def done_markers(dataset: Path) -> list[Path]:
    return sorted((dataset / "_work" / "done1").glob("*.done.json"))


class DaskCluster:
    """A ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1, started separately."""

    def __init__(self, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.file = tmp / "scheduler.json"
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", "0", "--no-dashboard", "--scheduler-file", str(self.file)],
            cwd=tmp, env=env or ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.workers: list[subprocess.Popen[bytes]] = []
        wait_for(self.file.exists, 60, "the scheduler file", 0.1)
        wait_for(lambda: "address" in self.file.read_text(), 10, "the scheduler address")

    @property
    def address(self) -> str:
        return json.loads(self.file.read_text())["address"]

    def worker_command(self, memory_limit: str) -> list[str]:
        return [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nthreads",
                "1", "--no-nanny", "--host", "127.0.0.1", "--no-dashboard", "--memory-limit",
                memory_limit]

    def launch(self, cmd: list[str]) -> subprocess.Popen[bytes]:
        """Start one worker command (a subclass may give it its own cwd, env, namespace)."""
        return subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def add_worker(self, memory_limit: str = "2GB") -> subprocess.Popen[bytes]:
        """A worker without a nanny: its pid is the process that runs the tasks."""
        w = self.launch(self.worker_command(memory_limit))
        self.workers.append(w)
        return w

    def count(self) -> int:
        from distributed import Client

        with Client(self.address, timeout=30) as c:
            return len(c.scheduler_info(n_workers=-1)["workers"])

    def wait_workers(self, n: int) -> None:
        from distributed import Client

        with Client(self.address, timeout=30) as c:
            c.wait_for_workers(n, timeout=60)

    def close(self) -> None:
        for p in [*self.workers, self.scheduler]:
            kill_tree(p.pid)


@contextlib.contextmanager
def dask_cluster(tmp: Path, workers: int) -> Iterator[DaskCluster]:
    cluster = DaskCluster(tmp)
    try:
        for _ in range(workers):
            cluster.add_worker()
        cluster.wait_workers(workers)
        yield cluster
    finally:
        cluster.close()
