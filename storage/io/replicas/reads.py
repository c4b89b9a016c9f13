"""A replica set's reads: verified reads with failover, hedged to the next replica when one
is silent for the hedge deadline (:mod:`storage.io.hedge`), repeated passes over replicas that
all failed transiently, throttling retried in place; ``get`` and ``read_manifest`` on top.
Mixed into :class:`storage.io.replicas.replica_set.ReplicaSet`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TypeVar

from storage.format.checksums import digest_bytes
from storage.format.layout import MANIFEST, UnsafePathError
from storage.format.manifest import DatasetNotFoundError, Manifest, ManifestError
from storage.io import hedge
from storage.io.replicas.errors import (
    ChecksumMismatchError,
    InvalidObjectError,
    ReplicaError,
    ReplicaStalledError,
    short_error,
)
from storage.io.replicas.health import Replica, ReplicaHealth
from storage.io.retry import THROTTLE, TRANSIENT, Backoff, classify, is_throttle
from storage.io.urls import Location, display_url

T = TypeVar("T")


def _timed(fn: Callable[[], T]) -> Callable[[], tuple[T, float]]:
    def run() -> tuple[T, float]:
        t0 = time.monotonic()
        out = fn()
        return out, time.monotonic() - t0
    return run



class ReplicaReads(ReplicaHealth):
    """The reads of :class:`storage.io.replicas.replica_set.ReplicaSet` (which sets these)."""

    url: str
    backoff: Backoff
    throttle_retries: int
    latency: hedge.LatencyTracker
    read_passes: int
    failovers: int
    hedges: int
    _lock: threading.Lock

    def _with_throttle_retries(self, fn: Callable[[], T]) -> T:
        for attempt in range(self.throttle_retries + 1):
            try:
                return fn()
            except Exception as exc:
                if not is_throttle(exc) or attempt == self.throttle_retries:
                    raise
                self.backoff.sleep(attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _failed(self, replica: Replica, exc: BaseException,
                errors: list[tuple[Replica, BaseException]]) -> None:
        errors.append((replica, exc))
        if not isinstance(exc, (FileNotFoundError, InvalidObjectError)):
            self._mark_failed(replica, exc)

    def _ask_one(self, replica: Replica, fetch: Callable[[Location], T],
                 errors: list[tuple[Replica, BaseException]]) -> tuple[bool, T | None]:
        """One replica, on the caller's thread (nothing to hedge to): the read timeout bounds
        the wait."""
        try:
            result, seconds = _timed(lambda: self._with_throttle_retries(
                lambda: fetch(replica.loc)))()
        except Exception as exc:
            self._failed(replica, exc, errors)
            return False, None
        self.latency.record(seconds)
        self._mark_ok(replica)
        return True, result

    def _ask_hedged(self, order: list[Replica], fetch: Callable[[Location], T],
                    errors: list[tuple[Replica, BaseException]]) -> tuple[bool, T | None]:
        """Ask ``order[0]``; whenever every request in flight has been silent for the hedge
        deadline, or one fails, ask the next replica too. The first success wins."""
        pool = hedge.pool()
        pending: dict[Future[tuple[T, float]], tuple[Replica, int, float]] = {}
        asked = 0

        def ask_next() -> None:
            nonlocal asked
            replica = order[asked]
            task = _timed(lambda: self._with_throttle_retries(lambda: fetch(replica.loc)))
            pending[pool.submit(task)] = (replica, asked, time.monotonic())
            asked += 1

        ask_next()
        while pending:
            timeout = self.latency.deadline() if asked < len(order) else None
            done, _ = wait(list(pending), timeout=timeout, return_when=FIRST_COMPLETED)
            if not done:  # silent for the hedge deadline: ask the next replica as well
                with self._lock:
                    self.hedges += 1
                ask_next()
                continue
            for fut in sorted(done, key=lambda f: pending[f][1]):
                replica, rank, _t0 = pending.pop(fut)
                exc = fut.exception()
                if exc is not None:
                    self._failed(replica, exc, errors)
                    if asked < len(order):
                        ask_next()
                    continue
                result, seconds = fut.result()
                self.latency.record(seconds)
                self._mark_ok(replica)
                now = time.monotonic()
                for loser, (slow, slow_rank, t0) in pending.items():
                    if slow_rank < rank:  # asked first, overtaken: it stalled
                        self._mark_failed(slow, ReplicaStalledError(
                            f"no answer in {now - t0:.2f} s; {replica.name} answered first"))
                    if not loser.cancel():  # queued ones never start; running ones finish alone
                        loser.add_done_callback(self._abandoned)
                if rank:
                    with self._lock:
                        self.failovers += 1
                return True, result
        return False, None

    def read(self, relative: str, fetch: Callable[[Location], T], what: str = "") -> T:
        """Run ``fetch`` against the replicas until one succeeds (hedging, failover, passes).

        ``fetch`` must verify what it returns (a checksum), since the first value returned
        wins. It may raise :class:`InvalidObjectError` for a copy that is present but unusable.
        """
        errors: list[tuple[Replica, BaseException]] = []
        for attempt in range(self.read_passes):
            if attempt:
                self.backoff.sleep(attempt - 1)
            errors = []
            self._start_probes(fetch)
            order = self.read_order()
            if len(order) == 1:
                ok, result = self._ask_one(order[0], fetch, errors)
            else:
                ok, result = self._ask_hedged(order, fetch, errors)
            if ok:
                return result  # type: ignore[return-value]
            kinds = {classify(e) for _, e in errors
                     if not isinstance(e, (FileNotFoundError, InvalidObjectError))}
            if not kinds or not kinds <= {TRANSIENT, THROTTLE}:
                break  # only a pass over replicas that all failed transiently is repeated
        invalid = sorted(((r.index, e) for r, e in errors if isinstance(e, InvalidObjectError)),
                         key=lambda x: x[0])
        if invalid:
            raise invalid[0][1].error
        lines = [f"{r.name}: missing ({short_error(e)})" if isinstance(e, FileNotFoundError)
                 else f"{r.name}: {short_error(e)}" for r, e in errors]
        missing_everywhere = all(isinstance(e, FileNotFoundError) for _, e in errors)
        exc_type = FileNotFoundError if missing_everywhere else ReplicaError
        raise exc_type(f"cannot read {what or relative} from any replica: " + "; ".join(lines))

    def get(self, relative: str, sha256: str | None = None, start: int | None = None,
            end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of an object, verified against ``sha256`` when given."""

        def fetch(loc: Location) -> bytes:
            data = loc.fs.cat_file(loc.path(relative), start=start, end=end)
            if sha256 and digest_bytes(data) != sha256:
                raise ChecksumMismatchError(
                    f"{relative}[{start}:{end}] has checksum {digest_bytes(data)[:12]}..., "
                    f"manifest says {sha256[:12]}...")
            return data

        where = relative if start is None else f"{relative}[{start}:{end}]"
        return self.read(relative, fetch, where)

    def read_manifest(self) -> Manifest:
        """The manifest from the first replica that has a valid one.

        A replica whose manifest does not validate (:class:`ManifestError`, or a path leaving
        the dataset root) is passed over like one that has none; when no replica has a valid
        one, the first replica's error is raised.
        """

        def fetch(loc: Location) -> Manifest:
            data = loc.fs.cat_file(loc.path(MANIFEST))
            try:
                return Manifest.from_json(data, source=display_url(loc.child_url(MANIFEST)))
            except (ManifestError, UnsafePathError) as exc:
                raise InvalidObjectError(exc) from exc

        try:
            return self.read(MANIFEST, fetch)
        except FileNotFoundError:
            raise DatasetNotFoundError(
                f"no dataset at {display_url(self.url)}: {MANIFEST} is missing on every "
                "replica (an unfinished or failed run leaves none)") from None
