"""The writer lease on a local directory and on the real S3 server (SeaweedFS/MinIO on
loopback): one holder at a time, under races too; stale leases taken over; a lost lease
refuses the commit check. Nothing mocked: real files, real conditional PUTs, real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from storage import resolve
from storage.format.layout import LEASE
from storage.io.lease import (
    Holder,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    StoreSilentError,
    _pid_namespace,
    call_within,
    conditional_creates,
    create_if_absent,
)
from storage.io.urls import Location


@pytest.fixture(params=["local", "s3"])
def loc(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "local":
        return resolve(str(tmp_path / "ds"))
    bucket = request.getfixturevalue("s3_bucket")
    return resolve(f"{bucket.url}/ds", bucket.storage_options)


def _raw(loc: Location) -> bytes:
    return loc.fs.cat_file(loc.path(LEASE))


def _plant(loc: Location, holder: Holder) -> None:
    """A lease some other run left behind."""
    if loc.is_local:
        Path(loc.path(LEASE)).parent.mkdir(parents=True, exist_ok=True)
        Path(loc.path(LEASE)).write_bytes(holder.to_bytes())
    else:
        getattr(loc.fs, "fsspec", loc.fs).pipe_file(loc.path(LEASE), holder.to_bytes())


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_writer_fails_at_once_naming_the_holder(loc: Location) -> None:
    first = Lease(loc, ttl_s=60)
    first.acquire()
    second = Lease(loc, ttl_s=60)
    t0 = time.monotonic()
    with pytest.raises(LeaseHeldError) as err:
        second.acquire(hint="wait with --wait")
    assert time.monotonic() - t0 < 5
    text = str(err.value)
    assert f"host {socket.gethostname()}" in text and f"pid {os.getpid()}" in text
    assert f"run {first.run_id}" in text and "since 20" in text and "expires 20" in text
    assert "--wait" in text and err.value.holder.run_id == first.run_id
    first.release()
    assert not loc.fs.exists(loc.path(LEASE))
    second.acquire()
    assert json.loads(_raw(loc))["run_id"] == second.run_id
    second.release()


def test_the_holder_renews_so_its_lease_never_goes_stale(loc: Location) -> None:
    with Lease(loc, ttl_s=1.5) as holder:
        time.sleep(3.5)  # more than two TTLs: only renewals keep it
        with pytest.raises(LeaseHeldError):
            Lease(loc, ttl_s=1.5).acquire()
        holder.check()
    assert not loc.fs.exists(loc.path(LEASE))


@pytest.mark.parametrize("how", ["expired", "dead_pid"])
def test_a_stale_lease_is_taken_over(loc: Location, how: str) -> None:
    now = time.time()
    expires = now - 5 if how == "expired" else now + 3600
    pid = _dead_pid() if how == "dead_pid" else 1
    _plant(loc, Holder(socket.gethostname(), pid, "deadrun", now - 100, expires, 60.0,
                       _pid_namespace()))
    lease = Lease(loc, ttl_s=60)
    lease.acquire()
    assert lease.took_over is not None and lease.took_over.run_id == "deadrun"
    assert json.loads(_raw(loc))["run_id"] == lease.run_id
    lease.check()
    lease.release()
    names = loc.fs.ls(loc.path(""), detail=False)
    assert not [n for n in names if "takeover" in n]  # the token is gone


def test_a_live_holder_on_another_host_is_not_stale(loc: Location) -> None:
    now = time.time()
    _plant(loc, Holder("other-host", 1, "liverun", now - 10, now + 60, 60.0, 1))
    with pytest.raises(LeaseHeldError, match="host other-host, pid 1, run liverun"):
        Lease(loc, ttl_s=60).acquire()


def test_wait_polls_until_the_holder_releases(loc: Location) -> None:
    first = Lease(loc, ttl_s=60)
    first.acquire()
    seen: list[Holder] = []
    threading.Timer(1.0, first.release).start()
    t0 = time.monotonic()
    second = Lease(loc, ttl_s=60)
    second.acquire(wait=True, poll_s=0.2, on_wait=seen.append)
    assert 0.8 < time.monotonic() - t0 < 10
    assert seen and seen[0].run_id == first.run_id
    second.release()


def test_a_lease_taken_over_after_expiry_fails_the_commit_check(loc: Location) -> None:
    slow = Lease(loc, ttl_s=1.0)
    slow.acquire()  # no renewal thread: a driver that stalled past its TTL
    time.sleep(1.2)
    other = Lease(loc, ttl_s=60)
    other.acquire()
    assert other.took_over is not None and other.took_over.run_id == slow.run_id
    with pytest.raises(LeaseLostError, match="lost the writer lease"):
        slow.check()
    slow.release()  # must not remove the new holder's lease
    assert json.loads(_raw(loc))["run_id"] == other.run_id
    other.check()
    other.release()


def _race(n: int, attempt: Callable[[int], bool],
          failed: list[int] | None = None) -> list[int]:
    """Run ``attempt(i)`` on ``n`` threads released together; the indices that won.

    With ``failed`` given, a racer whose request raised (a loaded S3 server can time a PUT
    out after it took effect) is recorded there instead of dying as an unhandled thread
    exception, so the caller can still check that nobody else won."""
    barrier = threading.Barrier(n)
    won: list[int] = []

    def go(i: int) -> None:
        barrier.wait()
        try:
            ok = attempt(i)
        except Exception:
            if failed is None:
                raise
            failed.append(i)
            return
        if ok:
            won.append(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def test_create_if_absent_has_exactly_one_winner_under_a_race(loc: Location) -> None:
    assert conditional_creates(loc)  # the real server honours If-None-Match
    for round_ in range(3):
        name = f"race-{round_}.json"
        failed: list[int] = []
        won = _race(12, lambda i, name=name: create_if_absent(loc, name, f"{i}".encode()),
                    failed)
        holder = int(loc.fs.cat_file(loc.path(name)))
        # Exactly one object was created: its writer is the one winner, unless its own
        # request timed out after the server took it (then it knows nothing and nobody won).
        assert won == [holder] or (won == [] and holder in failed), (won, failed, holder)
        assert len(failed) < 12, failed  # somebody got an answer


def test_the_fallback_without_conditional_writes_has_one_winner(loc: Location) -> None:
    """Forced fallback (what a store that ignores If-None-Match gets): write, settle, read
    back; every racer but the last writer sees foreign bytes."""
    won = _race(6, lambda i: create_if_absent(loc, "race.json", f"{i}".encode(), settle_s=0.5,
                                              conditional=False))
    assert len(won) == 1
    assert loc.fs.cat_file(loc.path("race.json")) == str(won[0]).encode()


def test_racing_writers_one_holder_also_over_a_stale_lease(loc: Location) -> None:
    for stale in (False, True):
        if stale:
            now = time.time()
            _plant(loc, Holder("gone-host", 7, "stale", now - 300, now - 1, 60.0, 1))
        leases = [Lease(loc, ttl_s=60) for _ in range(8)]

        won = _race(len(leases), lambda i, leases=leases: leases[i].try_acquire() is None)
        assert len(won) == 1, won
        assert json.loads(_raw(loc))["run_id"] == leases[won[0]].run_id
        assert all(lease.held == (i in won) for i, lease in enumerate(leases))
        leases[won[0]].release()


_ACQUIRE = """
import sys, time
from storage import resolve
from storage.io.lease import Lease, LeaseHeldError
loc = resolve(sys.argv[1])
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
try:
    Lease(loc, ttl_s=60).acquire()
    print("won")
except LeaseHeldError:
    print("held")
"""


def test_processes_racing_to_acquire_a_local_lease_one_wins(tmp_path: Path) -> None:
    """Separate processes (separate kernels' view of nothing shared but the directory)."""
    start = time.time() + 4
    procs = [subprocess.Popen([sys.executable, "-c", _ACQUIRE, str(tmp_path / "ds"),
                               str(start)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[3]) for _ in range(6)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(outs) == ["held"] * 5 + ["won"], outs


def test_a_take_over_token_left_by_a_dead_candidate_expires(tmp_path: Path) -> None:
    """A candidate that died between winning the take-over token and replacing the lease
    must not block the take-over for ever."""
    loc = resolve(str(tmp_path / "ds"))
    now = time.time()
    _plant(loc, Holder("gone-host", 7, "stale", now - 300, now - 1, 60.0, 1))
    token = Path(loc.path("_lease-takeover-stale.json"))
    token.write_bytes(b"{}")
    with pytest.raises(LeaseHeldError):  # a young token: a take-over may be under way
        Lease(loc, ttl_s=60).acquire()
    os.utime(token, (now - 120, now - 120))
    lease = Lease(loc, ttl_s=60)
    lease.acquire()
    assert lease.took_over is not None and not token.exists()
    lease.release()


def test_call_within_gives_up_in_time_and_hands_a_late_result_on() -> None:
    gate, late = threading.Event(), []

    def slow() -> str:
        gate.wait(10)
        return "taken"

    t0 = time.monotonic()
    with pytest.raises(StoreSilentError, match="no answer from the store in 0 s"):
        call_within(0.2, slow, "a test", on_late=late.append)
    assert time.monotonic() - t0 < 5  # gave up: the call itself takes 10 s
    gate.set()
    deadline = time.monotonic() + 10
    while not late and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late == ["taken"]
    assert call_within(5, lambda: 7, "a test") == 7
    with pytest.raises(KeyError):
        call_within(5, lambda: {}["x"], "a test")
