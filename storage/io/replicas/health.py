"""A replica set's health: each replica's back-off after failures (doubling, capped,
jittered), background probes once a back-off is over, the order in which replicas are asked,
and the status admin tools report. Mixed into
:class:`storage.io.replicas.replica_set.ReplicaSet`."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from storage.io import hedge
from storage.io.replicas.errors import InvalidObjectError, short_error
from storage.io.urls import Location, display_url


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



class ReplicaHealth:
    """Health bookkeeping of :class:`storage.io.replicas.replica_set.ReplicaSet` (which sets
    these)."""

    replicas: list[Replica]
    unhealthy_base_s: float
    unhealthy_cap_s: float
    probes: int
    errors: Counter[str]
    _lock: threading.Lock

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
            h.last_error = short_error(exc)
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
