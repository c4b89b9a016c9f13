"""A dataset stored in several replicas: quorum writes, verified reads with failover.

Every read names the checksum it expects (from the manifest); a replica that errors, times out
or returns bytes with the wrong checksum is marked unhealthy for a back-off period and the read
moves on to the next replica. Writes go to all replicas in parallel; fewer successes than the
write quorum fail loudly, naming the replicas, and a write that met the quorum but missed a
replica leaves a marker under ``_degraded/`` that ``repair`` completes.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from storage.checksums import digest_bytes
from storage.layout import MANIFEST
from storage.manifest import DatasetNotFoundError, Manifest, write_atomic
from storage.retry import Backoff, is_throttle
from storage.urls import Location, display_url, resolve

DEGRADED_DIR = "_degraded"
T = TypeVar("T")


class ReplicaError(IOError):
    """Every replica failed for one object; the message names each replica and its error."""


class QuorumError(IOError):
    """A write reached fewer replicas than the write quorum."""


class ChecksumMismatchError(IOError):
    """A replica returned bytes whose checksum is not the one in the manifest."""


@dataclass
class Health:
    failures: int = 0
    retry_at: float = 0.0
    last_error: str = ""


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


class ReplicaSet:
    """The replicas of one dataset, in order of preference (the first is the primary)."""

    def __init__(self, locations: list[Location], write_quorum: int | None = None,
                 backoff: Backoff | None = None, unhealthy_base_s: float = 2.0,
                 unhealthy_cap_s: float = 60.0, throttle_retries: int = 4) -> None:
        if not locations:
            raise ValueError("a replica set needs at least one location")
        self.replicas = [Replica(i, loc) for i, loc in enumerate(locations)]
        quorum = len(locations) if write_quorum is None else write_quorum
        if not 1 <= quorum <= len(locations):
            raise ValueError(f"write quorum {quorum} impossible with {len(locations)} replicas")
        self.write_quorum = quorum
        self.backoff = backoff or Backoff()
        self.unhealthy_base_s = unhealthy_base_s
        self.unhealthy_cap_s = unhealthy_cap_s
        self.throttle_retries = throttle_retries
        self.failovers = 0
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

    def _mark_failed(self, replica: Replica, exc: BaseException) -> None:
        with self._lock:
            h = replica.health
            h.failures += 1
            delay = min(self.unhealthy_cap_s, self.unhealthy_base_s * 2 ** (h.failures - 1))
            h.retry_at = time.monotonic() + delay * random.uniform(0.5, 1.0)
            h.last_error = _short(exc)
            self.errors[type(exc).__name__] += 1

    def _mark_ok(self, replica: Replica) -> None:
        if replica.health.failures:
            with self._lock:
                replica.health = Health()

    def read_order(self) -> list[Replica]:
        """Healthy replicas first (in preference order), then the others by retry time."""
        now = time.monotonic()
        healthy = [r for r in self.replicas if r.health.retry_at <= now]
        resting = sorted((r for r in self.replicas if r.health.retry_at > now),
                         key=lambda r: r.health.retry_at)
        return healthy + resting

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [{"replica": r.name, "healthy": r.health.retry_at <= now,
                 "failures": r.health.failures, "last_error": r.health.last_error}
                for r in self.replicas]

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

    def read(self, relative: str, fetch: Callable[[Location], T], what: str = "") -> T:
        """Run ``fetch`` against replicas in turn until one succeeds (failover)."""
        errors: list[str] = []
        for n, replica in enumerate(self.read_order()):
            try:
                result = self._with_throttle_retries(lambda r=replica: fetch(r.loc))
            except FileNotFoundError as exc:
                errors.append(f"{replica.name}: missing ({_short(exc)})")
                continue  # a missing object is the object's problem, not the replica's
            except Exception as exc:
                self._mark_failed(replica, exc)
                errors.append(f"{replica.name}: {_short(exc)}")
                continue
            self._mark_ok(replica)
            if n:
                with self._lock:
                    self.failovers += 1
            return result
        missing_everywhere = all(": missing" in e for e in errors)
        exc_type = FileNotFoundError if missing_everywhere else ReplicaError
        raise exc_type(f"cannot read {what or relative} from any replica: " + "; ".join(errors))

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
        """The manifest from the first replica that has a valid one."""
        try:
            text = self.get(MANIFEST).decode("utf-8")
        except FileNotFoundError:
            raise DatasetNotFoundError(
                f"no dataset at {display_url(self.url)}: {MANIFEST} is missing on every "
                "replica (an unfinished or failed run leaves none)") from None
        return Manifest.from_json(text, source=display_url(self.primary.child_url(MANIFEST)))

    # -- writes --------------------------------------------------------------------------

    def put(self, relative: str, data: bytes) -> list[str]:
        """Write to every replica; returns the names of replicas missed (degraded write)."""
        results: dict[int, BaseException | None] = {}

        def one(replica: Replica) -> None:
            try:
                write_atomic(replica.loc, relative, data)
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
            self._record_degraded(relative, ok, failed)
        return [r.name for r in failed]

    def _record_degraded(self, relative: str, ok: list[Replica], failed: list[Replica]) -> None:
        marker = json.dumps({"path": relative, "missing": [r.index for r in failed]},
                            sort_keys=True).encode()
        name = f"{DEGRADED_DIR}/{digest_bytes(relative.encode())[:20]}.json"
        for replica in ok:
            try:
                write_atomic(replica.loc, name, marker)
            except Exception as exc:  # the scrub in `repair` still finds the gap
                self._mark_failed(replica, exc)

    def delete(self, relative: str) -> None:
        """Remove an object from every replica that is reachable (missing is fine)."""
        for replica in self.replicas:
            try:
                path = replica.loc.path(relative)
                if replica.loc.fs.exists(path):
                    replica.loc.fs.rm_file(path)
            except Exception as exc:
                self._mark_failed(replica, exc)
