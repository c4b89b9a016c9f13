"""The admin commands that write a dataset (gc, repair, upgrade) hold its writer lease, like a
pipeline run: a gc during a run must not remove the shards the run wrote and no manifest names
yet. Real CLI processes on a real dataset; the "run" holding the lease is a real Lease."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from storage import resolve
from storage.format.layout import LEASE
from storage.io.lease import Lease
from storage.io.retry import is_store_error

REPO = Path(__file__).resolve().parents[3]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SHARDFLOW_STORAGE_OPTIONS"}
    return subprocess.run([sys.executable, "-m", "storage", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


@pytest.fixture
def dataset(tiny_dataset: str, tmp_path: Path) -> Path:
    copy = tmp_path / "ds"
    shutil.copytree(tiny_dataset, copy)
    return copy


def _orphan(ds: Path) -> Path:
    """A shard a run in progress wrote an hour ago: no manifest names it yet."""
    shard = ds / "shards" / "part-09999-0123456789abcdef.parquet"
    shard.write_bytes(b"written by the run in progress")
    old = time.time() - 7200
    os.utime(shard, (old, old))
    return shard


@pytest.mark.parametrize("command", [["gc", "--keep", "1", "--min-age", "60"], ["repair"],
                                     ["upgrade"]])
def test_a_writing_admin_command_fails_at_once_while_a_run_holds_the_lease(
        dataset: Path, command: list[str]) -> None:
    orphan = _orphan(dataset)
    run = Lease(resolve(str(dataset)), run_id="therunning1")
    run.acquire()
    try:
        t0 = time.monotonic()
        got = _cli(command[0], str(dataset), *command[1:])
        assert got.returncode == 2, got.stdout + got.stderr
        assert "therunning1" in got.stderr and "--wait" in got.stderr
        assert time.monotonic() - t0 < 60
        assert "Traceback" not in got.stderr
        assert orphan.exists()  # gc removed nothing the run wrote
        assert (dataset / LEASE).exists()  # and left the run's lease alone
    finally:
        run.release()


def test_gc_dry_run_needs_no_lease_and_gc_runs_once_it_is_free(dataset: Path) -> None:
    orphan = _orphan(dataset)
    run = Lease(resolve(str(dataset)), run_id="therunning2")
    run.acquire()
    try:
        dry = _cli("gc", str(dataset), "--keep", "1", "--min-age", "60", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert orphan.name in dry.stdout and orphan.exists()
    finally:
        run.release()
    real = _cli("gc", str(dataset), "--keep", "1", "--min-age", "60")
    assert real.returncode == 0, real.stderr
    assert not orphan.exists()
    assert not (dataset / LEASE).exists()  # gc released its own lease


def test_wait_takes_the_lease_once_the_run_releases_it(dataset: Path) -> None:
    run = Lease(resolve(str(dataset)), run_id="therunning3")
    run.acquire()
    threading.Timer(3.0, run.release).start()
    got = _cli("repair", str(dataset), "--wait")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "waiting for the writer lease" in got.stderr and "therunning3" in got.stderr


def test_store_errors_are_told_from_bugs() -> None:
    import botocore.exceptions as boto

    dead = boto.EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k")
    assert not isinstance(dead, OSError) and is_store_error(dead)
    try:
        try:
            raise dead
        except Exception as exc:
            raise RuntimeError("while listing _work/") from exc
    except RuntimeError as wrapped:
        assert is_store_error(wrapped)  # found along the cause chain
    assert is_store_error(FileNotFoundError("gone"))
    assert not is_store_error(KeyError("a bug"))
    assert not is_store_error(ValueError("a bug"))
