"""Hedged reads on local replicas: a ``fetch`` that blocks stands for a hung replica.

The real thing (a SIGSTOPped S3 server mid-epoch) is in test_s3.py; these pin down the rules:
who is asked when, who wins, who is marked, and that no caller thread waits on a hung replica.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from storage import ChecksumMismatchError, ReplicaSet
from storage.io.hedge import LatencyTracker, pool
from storage.io.replicas.replica_set import ReplicaStalledError

FLOOR = 0.2
#: a call slower than this waited on the hung replica (30 s) instead of hedging; a hedged
#: one takes a deadline or two (0.2 s each) and stays far below it on a loaded machine too
STALL_S = 10.0


class HungReplica:
    """``fetch`` for a replica set whose replica ``hung`` does not answer until released."""

    def __init__(self, hung: str) -> None:
        self.hung = hung
        self.release = threading.Event()
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, loc) -> str:  # type: ignore[no-untyped-def]
        with self.lock:
            self.calls.append(loc.url)
        if loc.url == self.hung and not self.release.wait(30):
            raise TimeoutError("read timeout")
        return loc.url


@pytest.fixture()
def urls(tmp_path: Path) -> list[str]:
    return [str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")]


def _store(urls: list[str], n: int = 2, **kwargs) -> ReplicaSet:  # type: ignore[no-untyped-def]
    tracker = LatencyTracker(floor_s=FLOOR, cap_s=FLOOR, min_samples=1)
    return ReplicaSet.from_urls(urls[:n], latency=tracker, **kwargs)


def test_a_hung_primary_is_hedged_and_then_avoided(urls: list[str]) -> None:
    fetch = HungReplica(urls[0])
    store = _store(urls)
    try:
        t0 = time.monotonic()
        assert store.read("x", fetch) == urls[1]
        first = time.monotonic() - t0
        assert FLOOR <= first < STALL_S  # waited the hedge deadline, not the hang
        assert store.hedges == 1 and store.failovers == 1
        assert store.errors[ReplicaStalledError.__name__] == 1
        status = store.status()
        assert not status[0]["healthy"] and "no answer in" in status[0]["last_error"]
        # Marked unhealthy: the next reads go straight to the healthy replica, no waiting.
        fetch.calls.clear()
        t0 = time.monotonic()
        for _ in range(20):
            assert store.read("x", fetch) == urls[1]
        assert fetch.calls == [urls[1]] * 20  # the hung one not asked
        # twenty reads that each waited a hedge deadline would take 20 x FLOOR (4 s)
        assert time.monotonic() - t0 < 10 * FLOOR
    finally:
        fetch.release.set()


def test_no_caller_thread_waits_on_the_hung_replica(urls: list[str]) -> None:
    """Eight loader threads reading at once: each gets its answer within about one hedge
    deadline, while the requests to the hung replica stay parked on the background pool."""
    fetch = HungReplica(urls[0])
    store = _store(urls)
    try:
        def one(_: int) -> float:
            t0 = time.monotonic()
            assert store.read("x", fetch) == urls[1]
            return time.monotonic() - t0

        with ThreadPoolExecutor(8) as callers:
            waits = list(callers.map(one, range(32)))
        # A caller that waited on the hung replica would wait its 30 s; the hedged ones take a
        # few deadlines (0.6 s typical here; one took 0.806 s in a fresh-clone CI run on the
        # 2 loaded cores, over the 0.8 s this bound was once): far apart either way.
        assert max(waits) < STALL_S, waits
        assert store.hedges <= 8  # only reads already on their way to it were hedged
        # one back-off step for the stall, however many requests were overtaken by it
        assert store.replicas[0].health.failures == 1
    finally:
        fetch.release.set()


def test_a_recovered_replica_is_probed_and_becomes_primary_again(urls: list[str]) -> None:
    fetch = HungReplica(urls[0])
    store = _store(urls, unhealthy_base_s=0.3, unhealthy_cap_s=0.3)
    assert store.read("x", fetch) == urls[1]
    assert [r.index for r in store.read_order()] == [1, 0]
    fetch.release.set()  # the server comes back (SIGCONT)
    time.sleep(0.35)  # back-off over: the next read probes replica 0 in the background
    assert store.read("x", fetch) == urls[1]  # the caller is still served by replica 1
    assert store.probes == 1
    deadline = time.monotonic() + 5
    while not store.status()[0]["healthy"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.status()[0]["healthy"]
    assert [r.index for r in store.read_order()] == [0, 1]
    fetch.calls.clear()
    assert store.read("x", fetch) == urls[0]
    assert fetch.calls == [urls[0]]


def test_a_probe_of_a_still_hung_replica_lengthens_its_back_off(urls: list[str]) -> None:
    fetch = HungReplica(urls[0])
    store = _store(urls, unhealthy_base_s=0.2, unhealthy_cap_s=5)
    try:
        store.read("x", fetch)
        time.sleep(0.25)
        t0 = time.monotonic()
        assert store.read("x", fetch) == urls[1]  # the probe hangs, the caller does not
        assert time.monotonic() - t0 < STALL_S
        assert store.status()[0]["state"] == "probing"
        assert [r.index for r in store.read_order()] == [1, 0]
    finally:
        fetch.release.set()


def test_the_first_verified_answer_wins(urls: list[str]) -> None:
    """A fast but corrupt answer does not win; the slow correct one does, and is not marked."""
    slow = threading.Event()

    def fetch(loc) -> str:  # type: ignore[no-untyped-def]
        if loc.url == urls[0]:
            slow.wait(FLOOR + 0.3)
            return "good"
        raise ChecksumMismatchError("bad bytes on replica 1")

    store = _store(urls)
    assert store.read("x", fetch) == "good"
    assert store.hedges == 1 and store.failovers == 0
    assert store.status()[0]["healthy"] and not store.status()[1]["healthy"]


def test_a_slow_primary_that_answers_first_is_not_marked(urls: list[str]) -> None:
    def fetch(loc) -> str:  # type: ignore[no-untyped-def]
        time.sleep(FLOOR + 0.1 if loc.url == urls[0] else 5)
        return loc.url

    store = _store(urls)
    assert store.read("x", fetch) == urls[0]
    assert store.hedges == 1 and store.failovers == 0
    assert all(s["healthy"] for s in store.status())


def test_a_failed_hedge_moves_on_to_the_third_replica(urls: list[str]) -> None:
    fetch = HungReplica(urls[0])

    def flaky(loc) -> str:  # type: ignore[no-untyped-def]
        if loc.url == urls[1]:
            raise ConnectionResetError("reset by peer")
        return fetch(loc)

    store = _store(urls, n=3)
    try:
        t0 = time.monotonic()
        assert store.read("x", flaky) == urls[2]
        assert time.monotonic() - t0 < STALL_S  # not the hung one's wait
        assert [s["healthy"] for s in store.status()] == [False, False, True]
    finally:
        fetch.release.set()


def test_a_single_replica_is_read_on_the_callers_thread(urls: list[str]) -> None:
    """Nothing to hedge to: no pool hop; the store's read timeout bounds the wait."""
    threads = []

    def fetch(loc) -> str:  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread())
        return "ok"

    store = _store(urls, n=1)
    assert store.read("x", fetch) == "ok"
    assert threads == [threading.current_thread()] and store.hedges == 0


def test_hedge_deadline_follows_observed_latency() -> None:
    t = LatencyTracker(window=20, factor=4, floor_s=0.3, cap_s=1.5, min_samples=5)
    assert t.deadline() == 1.5  # nothing observed yet: the cap
    for _ in range(20):
        t.record(0.01)
    assert t.deadline() == 0.3  # 4 x 10 ms is under the floor
    for _ in range(20):
        t.record(0.2)
    assert t.deadline() == pytest.approx(0.8)
    for _ in range(20):
        t.record(3.0)
    assert t.deadline() == 1.5
    with pytest.raises(ValueError):
        LatencyTracker(floor_s=2, cap_s=1)


def test_the_request_pool_is_bounded_and_never_blocks_the_caller() -> None:
    p = pool()
    gate = threading.Event()
    futures = [p.submit(gate.wait) for _ in range(p.threads + 5)]
    try:
        time.sleep(0.1)
        assert sum(f.running() for f in futures) <= p.threads
        assert len(p._workers) <= p.threads
    finally:
        gate.set()
    assert all(f.result(5) for f in futures)


def test_a_replica_set_with_its_tracker_pickles(urls: list[str]) -> None:
    import pickle

    store = _store(urls)
    store.latency.record(0.1)
    copy = pickle.loads(pickle.dumps(store))
    assert copy.latency.p95() == 0.1
    assert copy.read("x", lambda loc: loc.url) == urls[0]
