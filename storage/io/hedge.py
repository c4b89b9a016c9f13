"""Hedged reads: what a replica set needs to stop waiting on a slow replica.

A replica that accepts connections but does not answer (a stopped process, a GC pause, a full
disk, a partition) shows no error until the read timeout. Rather than wait for it, a replica
set asks the next replica for the same bytes once the first has been silent for longer than
:meth:`LatencyTracker.deadline` (a few times the recent p95 latency of successful reads, within
a floor and a cap), and takes the first verified answer.

Requests run on :func:`pool`, a small process-wide pool of daemon threads, so that a caller
never blocks on a request it has given up on: the abandoned request finishes (or times out)
in the background, and a hung request can neither hold the caller nor delay interpreter exit.
The pool is bounded (:data:`POOL_THREADS`); requests beyond it queue.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from infra.process.local import ProcessLocal

T = TypeVar("T")

#: threads shared by every replica set of the process; a hung replica holds one per abandoned
#: request for at most the read timeout, and a stalled replica is avoided after its first stall
POOL_THREADS = 32


class LatencyTracker(ProcessLocal):
    """Recent latencies of successful reads -> how long to wait before hedging."""

    _process_local = {"_lock": threading.Lock}

    def __init__(self, window: int = 64, factor: float = 4.0, floor_s: float = 0.3,
                 cap_s: float = 1.5, min_samples: int = 5) -> None:
        if not 0 < floor_s <= cap_s:
            raise ValueError(f"need 0 < floor_s <= cap_s, got {floor_s}, {cap_s}")
        self.factor, self.floor_s, self.cap_s = factor, floor_s, cap_s
        self.min_samples = min_samples
        self._recent: deque[float] = deque(maxlen=window)
        self._lock = threading.Lock()

    def record(self, seconds: float) -> None:
        with self._lock:
            self._recent.append(seconds)

    def p95(self) -> float | None:
        with self._lock:
            if len(self._recent) < self.min_samples:
                return None
            ordered = sorted(self._recent)
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]

    def deadline(self) -> float:
        """Seconds to wait for a replica before asking the next one too.

        ``factor`` x p95 of the recent successful reads, at least ``floor_s`` (loopback reads
        take milliseconds; hedging those would only double the load) and at most ``cap_s``;
        ``cap_s`` until ``min_samples`` reads have been seen.
        """
        p95 = self.p95()
        if p95 is None:
            return self.cap_s
        return min(self.cap_s, max(self.floor_s, self.factor * p95))


class _DaemonPool:
    """A bounded pool of daemon threads (``concurrent.futures`` workers are not daemons, so a
    hung request would hold up interpreter exit)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = \
            queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        self._queue.put((fut, fn))
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # claimed: a second submit must not count the same idle thread
            elif len(self._workers) < self.threads:
                t = threading.Thread(target=self._work, daemon=True,
                                     name=f"shardflow-hedge-{len(self._workers)}")
                self._workers.append(t)
                t.start()
            # else: every thread is busy; the request waits in the queue for the first free one
        return fut

    def _work(self) -> None:
        while True:  # daemon threads live as long as the process
            fut, fn = self._queue.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # handed to whoever waits on the future
                    fut.set_exception(exc)
            del fut, fn
            with self._lock:
                self._idle += 1


_pool: _DaemonPool | None = None
_pool_lock = threading.Lock()


def pool() -> _DaemonPool:
    """The process's request pool (created on first use, fresh in a forked child)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _DaemonPool(POOL_THREADS)
        return _pool


def _reset_after_fork() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()  # the parent's threads do not exist here


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
