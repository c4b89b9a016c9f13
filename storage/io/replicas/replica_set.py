"""A dataset stored in several replicas: quorum writes, verified and hedged reads with failover.

Every read names the checksum it expects (from the manifest). A replica that errors, times out
or returns bytes with the wrong checksum is marked unhealthy for a back-off period and the read
moves on to the next replica at once. A replica that is merely silent (hung, not dead) is not
waited for: once it has been silent for the hedge deadline (a few times the recent p95 latency,
see :mod:`storage.io.hedge`) the same read is also sent to the next replica, the first verified
answer wins, and the silent replica, overtaken, rests for the back-off too. The request given up
on finishes in the background on a bounded pool, never on the caller's thread. After its
back-off a replica gets one background probe (the read of the moment, sent to it as well as to
a healthy replica); when the probe succeeds the replica is healthy again and, if it is the
first, the primary again. The retry policy (deadlines, what is retried where) is described in
:mod:`storage.io.retry`.

Writes go to all replicas in parallel; fewer successes than the write quorum fail loudly, naming
the replicas, and a write that met the quorum but missed a replica leaves a marker under
``_degraded/`` that ``repair`` completes.

The jobs live apart: health, back-off and probes in :mod:`storage.io.replicas.health`, reads
in :mod:`storage.io.replicas.reads`, writes in :mod:`storage.io.replicas.writes`, the errors in
:mod:`storage.io.replicas.errors`; :class:`ReplicaSet` here holds the settings and counters
they share and composes them.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from storage.io import degraded, hedge
from storage.io.replicas.errors import (
    ChecksumMismatchError,
    InvalidObjectError,
    QuorumError,
    ReplicaError,
    ReplicaStalledError,
)
from storage.io.replicas.health import Health, Replica, ReplicaHealth
from storage.io.replicas.reads import ReplicaReads
from storage.io.replicas.writes import ReplicaWrites
from storage.io.retry import Backoff
from storage.io.urls import Location, resolve

DEGRADED_DIR = degraded.DEGRADED_DIR

__all__ = ["DEGRADED_DIR", "ChecksumMismatchError", "Health", "InvalidObjectError",
           "QuorumError", "Replica", "ReplicaError", "ReplicaSet", "ReplicaStalledError"]


class ReplicaSet(ReplicaReads, ReplicaWrites, ReplicaHealth):
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
