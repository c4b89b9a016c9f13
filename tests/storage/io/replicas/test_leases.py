"""The writer lease on every replica of an output (storage.io.replicas.leases): a writer of one
replica sees a writer of the whole set, whatever order either lists the replicas in; waiting
writers never deadlock; a replica that does not answer is skipped and taken once it does; a
rival on any replica refuses the commit. Real directories, the real S3 server, real threads."""

from __future__ import annotations

import io
import secrets
import shutil
import threading
import time
from pathlib import Path

import pytest

from loopback_s3 import S3Server
from storage import ReplicaSet
from storage.format.layout import LEASE
from storage.io.lease import (
    Holder,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    PrimaryUnavailableError,
)
from storage.io.replicas.leases import hold_replicas
from tests.storage.io._s3_faults import default_options, resume, stop


def _urls(tmp_path: Path, n: int = 2) -> list[str]:
    return [str(tmp_path / f"replica-{i}" / "ds") for i in range(n)]


def _holder_of(url: str) -> Holder | None:
    path = Path(url) / LEASE
    return Holder.from_bytes(path.read_bytes()) if path.exists() else None


def test_every_replica_holds_the_same_run_and_release_clears_them(tmp_path: Path) -> None:
    urls = _urls(tmp_path, 3)
    leases = hold_replicas(ReplicaSet.from_urls(urls), "run", log=io.StringIO())
    try:
        holders = [_holder_of(u) for u in urls]
        assert all(h is not None and h.run_id == leases.run_id for h in holders)
        assert len(leases.held_on) == 3
        leases.check()
    finally:
        leases.release()
    assert [_holder_of(u) for u in urls] == [None, None, None]


@pytest.mark.parametrize("other", ["one replica", "reversed"])
def test_a_writer_of_another_replica_order_is_refused_naming_the_replica(
        tmp_path: Path, other: str) -> None:
    """The bug: a gc of replica 1 alone (or a writer listing it first) took a lease the run
    did not hold, saw no writer and could remove the run's shards there."""
    urls = _urls(tmp_path)
    run = hold_replicas(ReplicaSet.from_urls(urls), "run", log=io.StringIO())
    try:
        theirs = [urls[1]] if other == "one replica" else urls[::-1]
        with pytest.raises(LeaseHeldError) as err:
            hold_replicas(ReplicaSet.from_urls(theirs), "gc", log=io.StringIO())
        # the other writer's primary is urls[1] either way, and it takes that one first
        assert run.run_id in str(err.value) and urls[1] in str(err.value)
        assert [_holder_of(u).run_id for u in urls] == [run.run_id] * 2  # type: ignore[union-attr]
        run.check()  # the refused writer left the run's leases alone
    finally:
        run.release()


def test_a_refused_writer_lets_go_of_the_leases_it_took_first(tmp_path: Path) -> None:
    """A writer of (1, 0) takes its primary, 1, then finds 0 held by someone else: it must
    not keep 1."""
    urls = _urls(tmp_path)
    blocker = Lease(ReplicaSet.from_urls([urls[0]]).primary, run_id="blocker0000001")
    blocker.acquire()
    try:
        with pytest.raises(LeaseHeldError, match="blocker0000001"):
            hold_replicas(ReplicaSet.from_urls(urls[::-1]), "repair", log=io.StringIO())
        assert (Path(urls[1])).exists() and _holder_of(urls[1]) is None
    finally:
        blocker.release()


def test_writers_waiting_in_opposite_orders_take_turns_without_deadlock(tmp_path: Path) -> None:
    """Each writer lists the replicas in another order and waits; leases are taken in URL
    order, so one always gets both and the other waits for it. Never two at once."""
    urls = _urls(tmp_path, 3)
    inside, most, done, errors = [0], [0], [], []
    lock = threading.Lock()

    def writer(order: list[str]) -> None:
        try:
            for _ in range(3):
                leases = hold_replicas(ReplicaSet.from_urls(order), "run", ttl_s=3.0,
                                       wait=True, log=io.StringIO())
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.05)
                leases.check()
                with lock:
                    inside[0] -= 1
                leases.release()
            done.append(order)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(o,)) for o in
               (urls, urls[::-1], [urls[2], urls[0], urls[1]])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(done) == 3, "a writer never got its leases: deadlock"
    assert most[0] == 1


def test_a_replica_that_does_not_answer_is_skipped_then_taken_once_it_does(
        tmp_path: Path) -> None:
    urls = _urls(tmp_path)
    blocked = Path(urls[1]).parent
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("a file where the replica's folder should be: every write there fails")
    log = io.StringIO()
    leases = hold_replicas(ReplicaSet.from_urls(urls), "run", ttl_s=1.5, log=log)
    try:
        assert "replica 1" in log.getvalue() and "did not answer" in log.getvalue()
        assert leases.held_on == ["primary"]
        leases.check()  # a replica that does not answer is left to the write quorum
        blocked.unlink()
        Path(urls[1]).mkdir(parents=True)
        deadline = time.monotonic() + 20
        while _holder_of(urls[1]) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        holder = _holder_of(urls[1])
        assert holder is not None and holder.run_id == leases.run_id
        leases.check()
    finally:
        leases.release()
    assert _holder_of(urls[1]) is None


def test_a_rival_on_a_skipped_replica_refuses_the_commit(tmp_path: Path) -> None:
    """While replica 1 did not answer the run, someone else (a gc of that replica alone)
    took its lease: the run must not commit over it."""
    urls = _urls(tmp_path)
    blocked = Path(urls[1]).parent
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("not a folder")
    leases = hold_replicas(ReplicaSet.from_urls(urls), "run", ttl_s=60, log=io.StringIO())
    try:
        blocked.unlink()
        rival = Lease(ReplicaSet.from_urls([urls[1]]).primary, run_id="rivalgc0000001")
        rival.acquire()
        try:
            with pytest.raises(LeaseLostError, match="rivalgc0000001") as err:
                leases.check()
            assert "replica 1" in str(err.value)
        finally:
            rival.release()
    finally:
        leases.release()


def test_a_secondary_lease_overwritten_by_another_writer_refuses_the_commit(
        tmp_path: Path) -> None:
    urls = _urls(tmp_path)
    leases = hold_replicas(ReplicaSet.from_urls(urls), "run", log=io.StringIO())
    try:
        thief = Holder("elsewhere", 4242, "thief000000001", time.time(), time.time() + 600, 600)
        (Path(urls[1]) / LEASE).write_bytes(thief.to_bytes())
        with pytest.raises(LeaseLostError, match="thief000000001"):
            leases.check()
    finally:
        leases.release()
    assert _holder_of(urls[1]).run_id == "thief000000001"  # type: ignore[union-attr]
    shutil.rmtree(tmp_path / "replica-1")


def test_on_s3_a_gc_of_one_bucket_sees_the_run_on_both(s3_buckets) -> None:  # type: ignore[no-untyped-def]
    urls = [f"{b.url}/ds" for b in s3_buckets]
    options = [b.storage_options for b in s3_buckets]
    run = hold_replicas(ReplicaSet.from_urls(urls, replica_options=options), "run",
                        log=io.StringIO())
    try:
        for url, opts in zip(urls, options, strict=True):
            with pytest.raises(LeaseHeldError, match=run.run_id):
                hold_replicas(ReplicaSet.from_urls([url], opts), "gc", log=io.StringIO())
        run.check()
    finally:
        run.release()
    again = hold_replicas(ReplicaSet.from_urls(urls[::-1], replica_options=options[::-1]),
                          "gc", log=io.StringIO())
    again.release()


def test_a_hung_replica_costs_the_writer_its_answer_time_then_is_taken(
        fault_servers: list[S3Server]) -> None:
    """SIGSTOP: the server accepts connections and never answers. Its client would wait for
    minutes; the writer goes on after ``answer_s`` and takes the lease once it answers."""
    buckets = [s.make_bucket(f"hung-{secrets.token_hex(4)}") for s in fault_servers]
    urls = [f"{b.url}/ds" for b in buckets]
    options = [default_options(b) for b in buckets]
    store = ReplicaSet.from_urls(urls, replica_options=options)
    stop(fault_servers[1])
    log = io.StringIO()
    try:
        t0 = time.monotonic()
        leases = hold_replicas(store, "run", ttl_s=3.0, log=log, answer_s=2.0)
        took = time.monotonic() - t0
        assert took < 10, took
        assert "replica 1" in log.getvalue() and "no answer from the store in 2 s" in \
            log.getvalue()
        assert options[1]["secret"] not in log.getvalue()
        t0 = time.monotonic()
        leases.check()  # a silent replica is left to the write quorum
        assert time.monotonic() - t0 < 10
    finally:
        resume(fault_servers[1])
    try:
        deadline = time.monotonic() + 60
        while "replica 1" not in " ".join(leases.held_on) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(leases.held_on) == 2, "the lease was not taken once the replica answered"
        leases.check()
    finally:
        leases.release()
    for url, opts in zip(urls, options, strict=True):
        free = hold_replicas(ReplicaSet.from_urls([url], opts), "gc", log=io.StringIO())
        free.release()


def test_a_hung_primary_is_one_clear_error_after_its_answer_time(
        fault_servers: list[S3Server]) -> None:
    buckets = [s.make_bucket(f"hungp-{secrets.token_hex(4)}") for s in fault_servers]
    store = ReplicaSet.from_urls([f"{b.url}/ds" for b in buckets],
                                 replica_options=[default_options(b) for b in buckets])
    stop(fault_servers[0])
    try:
        t0 = time.monotonic()
        with pytest.raises(PrimaryUnavailableError, match="primary replica 0 .* is unreachable"):
            hold_replicas(store, "run", log=io.StringIO(), answer_s=2.0)
        assert time.monotonic() - t0 < 10
    finally:
        resume(fault_servers[0])
    # The attempt given up on was still in flight: once the server answers it creates the
    # lease, which would block every writer for its TTL (90 s); it is let go of at once.
    primary = store.replicas[0].loc
    seen = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        primary.fs.invalidate_cache()
        seen.append(primary.fs.exists(primary.path(LEASE)))
        time.sleep(0.1)
    assert not seen[-1], "the late lease was left on the primary"
