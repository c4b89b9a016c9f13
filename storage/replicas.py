"""A dataset stored in several replicas: quorum writes, verified and hedged reads with failover.

Every read names the checksum it expects (from the manifest). A replica that errors, times out
or returns bytes with the wrong checksum is marked unhealthy for a back-off period and the read
moves on to the next replica at once. A replica that is merely silent (hung, not dead) is not
waited for: once it has been silent for the hedge deadline (a few times the recent p95 latency,
see :mod:`storage.hedge`) the same read is also sent to the next replica, the first verified
answer wins, and the silent replica, overtaken, rests for the back-off too. The request given up
on finishes in the background on a bounded pool, never on the caller's thread. After its
back-off a replica gets one background probe (the read of the moment, sent to it as well as to
a healthy replica); when the probe succeeds the replica is healthy again and, if it is the
first, the primary again. The retry policy (deadlines, what is retried where) is described in
:mod:`storage.retry`.

Writes go to all replicas in parallel; fewer successes than the write quorum fail loudly, naming
the replicas, and a write that met the quorum but missed a replica leaves a marker under
``_degraded/`` that ``repair`` completes.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from storage import degraded, hedge
from storage.checksums import digest_bytes
from storage.layout import MANIFEST, UnsafePathError
from storage.manifest import DatasetNotFoundError, Manifest, ManifestError, write_atomic
from storage.retry import THROTTLE, TRANSIENT, Backoff, classify, is_throttle
from storage.urls import Location, display_url, resolve, write_deadline_s

DEGRADED_DIR = degraded.DEGRADED_DIR
T = TypeVar("T")


class ReplicaError(IOError):
    """Every replica failed for one object; the message names each replica and its error."""


class QuorumError(IOError):
    """A write reached fewer replicas than the write quorum."""


class ChecksumMismatchError(IOError):
    """A replica returned bytes whose checksum is not the one in the manifest."""


class ReplicaStalledError(TimeoutError):
    """A replica did not answer a read before another replica, asked later, did (a hedge won)."""


class InvalidObjectError(Exception):
    """Raised by a ``fetch`` when the replica answered but its copy of the object is unusable
    (an invalid manifest): like a missing object, the object's problem and not the replica's,
    so the read moves on without marking the replica unhealthy. ``error`` is re-raised when
    no replica has a usable copy."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class Health:
    failures: int = 0  # consecutive failed back-off periods; 0 = healthy
    retry_at: float = 0.0  # monotonic time when the back-off ends and a probe may go
    last_error: str = ""
    probing: bool = False  # a background probe is in flight


@dataclass
class Replica:
    """One copy of the dataset: where it is and how it has been behaving."""

    index: int
    loc: Location = field(repr=False)
    health: Health = field(default_factory=Health)

    @property
    def name(self) -> str:
        """A label safe for logs and errors: the URL without any credentials."""
        return f"replica {self.index} ({display_url(self.loc.url)})"


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


class _WriteDeadline:
    """An async filesystem (s3fs, ...) whose whole-object writes are cancelled after
    ``seconds``: fsspec's ``timeout`` wraps the request in ``asyncio.wait_for``."""

    def __init__(self, fs: Any, seconds: float) -> None:
        self._fs, self._seconds = fs, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def _bounded(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from fsspec.exceptions import FSTimeoutError

        try:
            return call(*args, timeout=self._seconds, **kwargs)
        except FSTimeoutError as exc:
            raise TimeoutError(f"{what} not done in {self._seconds:.1f} s (cancelled)") from exc

    def pipe_file(self, path: str, data: bytes, **kwargs: Any) -> Any:
        return self._bounded(f"write of {len(data):,} bytes to {path}", self._fs.pipe_file,
                             path, data, **kwargs)

    def cp_file(self, source: str, path: str, **kwargs: Any) -> Any:
        """A server-side copy, under the same deadline as writing the bytes would have."""
        return self._bounded(f"copy of {source} to {path}", self._fs.cp_file, source, path,
                             **kwargs)


def _with_write_deadline(loc: Location, nbytes: int) -> Location:
    from fsspec.asyn import AsyncFileSystem

    fs = getattr(loc.fs, "fsspec", loc.fs)  # the s3fs behind an obstore read client writes
    if not isinstance(fs, AsyncFileSystem):
        return loc  # local and other blocking filesystems: the OS's own semantics
    return dataclasses.replace(loc, fs=_WriteDeadline(fs, write_deadline_s(nbytes)))


def _timed(fn: Callable[[], T]) -> Callable[[], tuple[T, float]]:
    def run() -> tuple[T, float]:
        t0 = time.monotonic()
        out = fn()
        return out, time.monotonic() - t0
    return run


class ReplicaSet:
    """The replicas of one dataset, in order of preference (the first is the primary).

    ``latency`` decides when a read is hedged to the next replica (default: 4x the p95 of the
    last 64 successful reads, between 0.3 and 1.5 s). ``read_passes``: how many times a read
    goes over the replicas when every one failed with a transient error (connection refused
    or reset, HTTP 500/502/504). Counters: ``failovers`` (reads answered by another replica
    than the first one asked), ``hedges`` (second requests sent because the first was silent),
    ``probes`` (background reads to a replica after its back-off), ``errors`` (by type).
    """

    def __init__(self, locations: list[Location], write_quorum: int | None = None,
                 backoff: Backoff | None = None, unhealthy_base_s: float = 2.0,
                 unhealthy_cap_s: float = 60.0, throttle_retries: int = 4,
                 latency: hedge.LatencyTracker | None = None, read_passes: int = 2,
                 sync: bool = True) -> None:
        if not locations:
            raise ValueError("a replica set needs at least one location")
        self.replicas = [Replica(i, loc.confined()) for i, loc in enumerate(locations)]
        quorum = len(locations) if write_quorum is None else write_quorum
        if not 1 <= quorum <= len(locations):
            raise ValueError(f"write quorum {quorum} impossible with {len(locations)} replicas")
        self.write_quorum = quorum
        self.backoff = backoff or Backoff()
        self.unhealthy_base_s = unhealthy_base_s
        self.unhealthy_cap_s = unhealthy_cap_s
        self.throttle_retries = throttle_retries
        self.latency = latency or hedge.LatencyTracker()
        self.read_passes = max(1, read_passes)
        #: local writes reach the disk before ``put`` returns (see ``write_atomic``'s ``sync``)
        self.sync = sync
        self.failovers = 0
        self.hedges = 0
        self.probes = 0
        self.errors: Counter[str] = Counter()  # failed reads/writes by exception type
        self._lock = threading.Lock()

    @classmethod
    def from_urls(cls, urls: list[str], storage_options: dict[str, Any] | None = None,
                  replica_options: list[dict[str, Any] | None] | None = None,
                  **kwargs: Any) -> ReplicaSet:
        """Replicas from URLs; ``replica_options[i]`` overrides the shared options for URL i."""
        per = replica_options or [None] * len(urls)
        locs = [resolve(u, o if o is not None else storage_options) for u, o in zip(urls, per,
                                                                                   strict=True)]
        return cls(locs, **kwargs)

    @property
    def primary(self) -> Location:
        return self.replicas[0].loc

    @property
    def url(self) -> str:
        return self.primary.url

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- health --------------------------------------------------------------------------

    def _count_error(self, exc: BaseException) -> None:
        with self._lock:
            self.errors[type(exc).__name__] += 1

    def _mark_failed(self, replica: Replica, exc: BaseException) -> None:
        """Start (or lengthen) the replica's back-off; one step per back-off period.

        Failures while the replica already rests (other requests that were in flight when it
        failed, a last-resort read) do not lengthen its back-off again.
        """
        with self._lock:
            h = replica.health
            self.errors[type(exc).__name__] += 1
            h.last_error = _short(exc)
            h.probing = False
            now = time.monotonic()
            if h.failures and h.retry_at > now:
                return
            h.failures += 1
            delay = min(self.unhealthy_cap_s, self.unhealthy_base_s * 2 ** (h.failures - 1))
            h.retry_at = now + delay * random.uniform(0.5, 1.0)

    def _mark_ok(self, replica: Replica) -> None:
        if replica.health.failures or replica.health.probing:
            with self._lock:
                replica.health = Health()

    def read_order(self) -> list[Replica]:
        """Whom to ask, in order: healthy replicas (in preference order), then those whose
        back-off is over but that no probe has cleared yet, then the resting ones by the end of
        their back-off, then those being probed."""
        now = time.monotonic()
        healthy, due, resting, probing = [], [], [], []
        for r in self.replicas:
            h = r.health
            if not h.failures:
                healthy.append(r)
            elif h.probing:
                probing.append(r)
            elif h.retry_at <= now:
                due.append(r)
            else:
                resting.append(r)
        return healthy + due + sorted(resting, key=lambda r: r.health.retry_at) + probing

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        out = []
        for r in self.replicas:
            h = r.health
            state = ("healthy" if not h.failures else "probing" if h.probing
                     else "resting" if h.retry_at > now else "due")
            out.append({"replica": r.name, "healthy": not h.failures, "state": state,
                        "failures": h.failures, "last_error": h.last_error})
        return out

    # -- reads ---------------------------------------------------------------------------

    def _with_throttle_retries(self, fn: Callable[[], T]) -> T:
        for attempt in range(self.throttle_retries + 1):
            try:
                return fn()
            except Exception as exc:
                if not is_throttle(exc) or attempt == self.throttle_retries:
                    raise
                self.backoff.sleep(attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_probes(self, fetch: Callable[[Location], Any]) -> None:
        """Send this read also to replicas whose back-off is over, in the background, while a
        healthy replica serves the caller; a probe that succeeds makes its replica healthy."""
        now = time.monotonic()
        with self._lock:
            if not any(not r.health.failures for r in self.replicas):
                return  # nobody healthy: callers ask the due replicas themselves
            due = [r for r in self.replicas
                   if r.health.failures and not r.health.probing and r.health.retry_at <= now]
            for r in due:
                r.health.probing = True
                self.probes += 1
        for r in due:
            fut = hedge.pool().submit(lambda r=r: fetch(r.loc))
            fut.add_done_callback(lambda f, r=r: self._probe_done(r, f))

    def _probe_done(self, replica: Replica, fut: Future[Any]) -> None:
        exc = fut.exception()
        if exc is None or isinstance(exc, (FileNotFoundError, InvalidObjectError)):
            self._mark_ok(replica)  # it answered
        else:
            self._mark_failed(replica, exc)

    def _abandoned(self, fut: Future[Any]) -> None:
        """A request nobody waits for any more: count its error, if any, and forget it."""
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None and not isinstance(exc, (FileNotFoundError, InvalidObjectError)):
            self._count_error(exc)

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
        lines = [f"{r.name}: missing ({_short(e)})" if isinstance(e, FileNotFoundError)
                 else f"{r.name}: {_short(e)}" for r, e in errors]
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

    # -- writes --------------------------------------------------------------------------

    def put(self, relative: str, data: bytes, same_as: str | None = None) -> list[str]:
        """Write to every replica; returns the names of replicas missed (degraded write).

        ``same_as``: an object on the primary replica holding exactly ``data``, which the
        primary may link or copy inside the store instead of writing the bytes (see
        :func:`storage.manifest.write_atomic`).
        """
        results: dict[int, BaseException | None] = {}

        def one(replica: Replica) -> None:
            try:
                self._write_with_retries(replica, relative, data,
                                         same_as if replica.index == 0 else None)
                results[replica.index] = None
            except Exception as exc:
                results[replica.index] = exc

        if len(self.replicas) == 1:
            one(self.replicas[0])
        else:
            with ThreadPoolExecutor(len(self.replicas)) as pool:
                list(pool.map(one, self.replicas))
        failed = [r for r in self.replicas if results[r.index] is not None]
        ok = [r for r in self.replicas if results[r.index] is None]
        for r in failed:
            self._mark_failed(r, results[r.index])  # type: ignore[arg-type]
        if len(ok) < self.write_quorum:
            detail = "; ".join(f"{r.name}: {_short(results[r.index])}"  # type: ignore[arg-type]
                               for r in failed)
            raise QuorumError(f"write of {relative} reached {len(ok)} of {len(self.replicas)} "
                              f"replicas, quorum is {self.write_quorum}: {detail}")
        if failed:
            self._record_degraded(relative, digest_bytes(data), ok, failed)
        return [r.name for r in failed]

    def _write_with_retries(self, replica: Replica, relative: str, data: bytes,
                            same_as: str | None = None) -> None:
        """The write side of the policy in :mod:`storage.retry`: throttling is retried with
        back-off, a transient failure (connection refused or reset, HTTP 5xx) once; a timeout is
        not (the replica is hung: waiting for it again only doubles the stall). A PUT to an
        object store is cancelled after :func:`storage.urls.write_deadline_s`. Rewriting the
        same bytes is idempotent."""
        transient_left = 1
        loc = _with_write_deadline(replica.loc, len(data))
        for attempt in range(self.throttle_retries + 2):
            try:
                write_atomic(loc, relative, data, same_as, sync=self.sync)
                return
            except Exception as exc:
                kind = classify(exc)
                if kind == THROTTLE and attempt < self.throttle_retries:
                    self.backoff.sleep(attempt)
                    continue
                if kind == TRANSIENT and transient_left:
                    transient_left -= 1
                    self.backoff.sleep(attempt)
                    continue
                raise

    def _record_degraded(self, relative: str, sha256: str, ok: list[Replica],
                         failed: list[Replica]) -> None:
        """Leave a marker (:mod:`storage.degraded`) on the replicas written: which object,
        which bytes, which replicas missed it (by URL, so any admin ordering finds them)."""
        by_loc = {id(r.loc): r for r in ok}
        for loc, exc in degraded.record([r.loc for r in ok], relative, sha256,
                                        [(r.index, r.loc.url) for r in failed]):
            self._mark_failed(by_loc[id(loc)], exc)  # the scrub in `repair` still finds the gap

    def delete(self, relative: str) -> None:
        """Remove an object from every replica that is reachable (missing is fine)."""
        for replica in self.replicas:
            try:
                path = replica.loc.path(relative)
                if replica.loc.fs.exists(path):
                    replica.loc.fs.rm_file(path)
            except Exception as exc:
                self._mark_failed(replica, exc)
