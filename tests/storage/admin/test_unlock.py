"""``python -m storage unlock`` as an operator meets it: it shows each replica's writer lease
and breaks what no live writer holds (an invalid lease, an expired one, one whose holder died
on this host), leaves a fresh lease of a writer on another host alone unless ``--force``, and
addresses every replica of a set. Real CLI processes, local folders and buckets on the real S3
server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.config import STORAGE_OPTIONS_ENV
from storage import resolve
from storage.format.layout import LEASE
from storage.io.lease import FORMAT, Lease, _pid_namespace
from storage.io.urls import Location

REPO = Path(__file__).resolve().parents[3]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != STORAGE_OPTIONS_ENV}
    return subprocess.run([sys.executable, "-m", "storage", *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=env)


class Place:
    """One replica: its URL, the CLI flags that reach it and its Location."""

    def __init__(self, url: str, options: dict[str, object] | None, tmp: Path) -> None:
        self.url, self.flags = url, []
        if options is not None:
            f = tmp / f"opts-{abs(hash(url))}.json"
            f.write_text(json.dumps(options))
            self.flags = ["--storage-options", f"@{f}"]
        self.loc: Location = resolve(url, options)

    def put(self, data: bytes) -> None:
        if self.loc.is_local:
            Path(self.loc.path("")).mkdir(parents=True, exist_ok=True)
            Path(self.loc.path(LEASE)).write_bytes(data)
        else:
            getattr(self.loc.fs, "fsspec", self.loc.fs).pipe_file(self.loc.path(LEASE), data)

    def lease(self) -> bytes | None:
        fs = getattr(self.loc.fs, "fsspec", self.loc.fs)
        fs.invalidate_cache()
        path = self.loc.path(LEASE)
        return fs.cat_file(path) if fs.isfile(path) else None

    def exists(self) -> bool:
        fs = getattr(self.loc.fs, "fsspec", self.loc.fs)
        fs.invalidate_cache()
        return fs.exists(self.loc.path(LEASE))


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "local":
        return Place(str(tmp_path / "ds"), None, tmp_path)
    bucket = request.getfixturevalue("s3_bucket")
    return Place(f"{bucket.url}/ds", bucket.storage_options, tmp_path)


def _lease(**changes: object) -> bytes:
    now = time.time()
    d: dict[str, object] = {"host": "other-host", "pid": 4242, "run_id": "liverun",
                            "started": now - 30, "expires": now + 60, "ttl_s": 60.0,
                            "pidns": 1, "format": FORMAT}
    d.update(changes)
    return json.dumps(d, allow_nan=True).encode()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("crafted", [
    b"\x00 not a lease at all",
    _lease(expires=float("nan")),
    _lease(expires=1e18),
    b"[" * 100_000 + b"]" * 100_000,
])
def test_unlock_clears_a_crafted_lease(place: Place, crafted: bytes) -> None:
    place.put(crafted)
    got = _cli("unlock", place.url, *place.flags)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "an invalid writer lease" in got.stdout and "broken: it is invalid" in got.stdout
    assert "Traceback" not in got.stderr
    assert not place.exists()
    Lease(place.loc, ttl_s=60).acquire()  # the next writer gets it at once


def test_unlock_clears_a_folder_in_the_leases_place(place: Place) -> None:
    if place.loc.is_local:
        Path(place.loc.path(LEASE)).mkdir(parents=True)
    else:
        getattr(place.loc.fs, "fsspec", place.loc.fs).pipe_file(
            place.loc.path(f"{LEASE}/x"), b"x")
    got = _cli("unlock", place.url, *place.flags)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "it is a folder" in got.stdout and "broken" in got.stdout
    lease = Lease(place.loc, ttl_s=60)
    lease.acquire()  # nothing in its way any more (some stores refused it beside a folder)
    lease.release()


def test_unlock_leaves_a_live_holder_on_another_host_alone_without_force(place: Place) -> None:
    live = _lease()
    place.put(live)
    got = _cli("unlock", place.url, *place.flags)
    assert got.returncode == 1, got.stdout + got.stderr
    out = got.stdout
    assert "writer lease of host other-host, pid 4242, run liverun, since" in out
    assert "s ago), expires" in out and "left alone" in out
    assert "cannot be confirmed dead" in out and "--force" in out
    assert place.lease() == live

    forced = _cli("unlock", place.url, *place.flags, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "broken: --force" in forced.stdout
    assert "warning:" in forced.stderr and "may still run" in forced.stderr
    assert not place.exists()


def test_unlock_breaks_a_dead_local_holder_and_an_expired_lease(tmp_path: Path) -> None:
    dead = Place(str(tmp_path / "dead"), None, tmp_path)
    dead.put(_lease(host=socket.gethostname(), pid=_dead_pid(), pidns=_pid_namespace()))
    expired = Place(str(tmp_path / "expired"), None, tmp_path)
    expired.put(_lease(expires=time.time() - 5))
    got = _cli("unlock", dead.url)
    assert got.returncode == 0 and "its holder is gone" in got.stdout, got.stdout + got.stderr
    got = _cli("unlock", expired.url)
    assert got.returncode == 0 and "it has expired" in got.stdout, got.stdout + got.stderr
    assert not dead.exists() and not expired.exists()
    assert not got.stderr  # no warning: nothing was forced


def test_unlock_leaves_a_live_process_of_this_host_alone(tmp_path: Path) -> None:
    here = Place(str(tmp_path / "ds"), None, tmp_path)
    lease = Lease(here.loc, ttl_s=60, run_id="thisprocess1")
    lease.acquire()
    try:
        got = _cli("unlock", here.url)
        assert got.returncode == 1, got.stdout + got.stderr
        assert f"still runs on this host (pid {os.getpid()} is alive)" in got.stdout
        lease.check()  # untouched
    finally:
        lease.release()


def test_unlock_addresses_every_replica_local_and_s3(s3_bucket, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    options = s3_bucket.storage_options
    local = Place(str(tmp_path / "ds"), None, tmp_path)
    remote = Place(f"{s3_bucket.url}/ds", options, tmp_path)
    local.put(_lease())  # a live writer elsewhere
    remote.put(b"garbage")  # invalid
    config = tmp_path / "replicas.json"
    config.write_text(json.dumps({"replica": [
        {"url": local.url}, {"url": remote.url, "storage_options": options}]}))
    got = _cli("unlock", "--replica-config", str(config))
    assert got.returncode == 1, got.stdout + got.stderr
    assert f"replica 0 ({local.url}): writer lease of host other-host" in got.stdout
    assert f"replica 1 ({remote.url}): an invalid writer lease" in got.stdout
    assert local.exists() and not remote.exists()
    assert options["secret"] not in got.stdout + got.stderr  # type: ignore[operator]


def test_unlock_dry_run_and_help(tmp_path: Path) -> None:
    here = Place(str(tmp_path / "ds"), None, tmp_path)
    here.put(b"garbage")
    got = _cli("unlock", here.url, "--dry-run")
    assert got.returncode == 0 and "would be broken: it is invalid" in got.stdout
    assert here.lease() == b"garbage"
    empty = _cli("unlock", str(tmp_path / "nothing"))
    assert empty.returncode == 0 and "no writer lease" in empty.stdout
    helped = _cli("unlock", "--help")
    assert helped.returncode == 0 and "Usage: python -m storage unlock" in helped.stdout
    assert "--force" in helped.stdout and "--dry-run" in helped.stdout


def test_a_writing_command_refused_by_a_lease_names_unlock(tmp_path: Path) -> None:
    here = Place(str(tmp_path / "ds"), None, tmp_path)
    here.put(_lease())
    got = _cli("repair", here.url)
    assert got.returncode == 2
    assert f"if that writer is gone: python -m storage unlock {here.url}" in got.stderr
    here.put(b"garbage")
    got = _cli("gc", here.url, "--keep", "1")
    assert got.returncode == 2 and "invalid lease" in got.stderr
    assert f"to remove it now: python -m storage unlock {here.url}" in got.stderr
    assert "bring it back" not in got.stderr and "Traceback" not in got.stderr
