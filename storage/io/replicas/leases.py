"""The writer lease of an output on every replica, not on the primary alone.

Why: a writer that held the lease on its primary only was invisible to a writer whose primary
is another replica of the same output. ``storage gc /b/ds`` (an operator cleaning one replica
at a time) during a run into ``/a/ds`` and ``/b/ds`` took b's lease, saw no writer and removed
the shards and tokenizer the run had written on b and no manifest named yet; so could any two
writers that listed the replicas in different orders (as the hint for a primary that is down
invites).

Rules, on top of :mod:`storage.io.lease` (one lease object per replica, one run id for all):

- a writer that waits (``--wait``) takes the leases in one order for every writer, the
  replicas' URLs sorted, so two waiting writers never each hold a lease the other waits for;
  one that does not wait takes the primary's first (a primary that is down then stops it
  before it touches another replica) and fails at once on a held one, letting go of all;
- the primary must answer (:class:`~storage.io.lease.PrimaryUnavailableError`: a run's scratch
  lives there); another replica that refuses or does not answer within
  :data:`~storage.io.lease.ANSWER_S` (a hung server) is skipped with a line, and its lease is
  taken in the background once it answers (tried every third of the TTL);
- a lease another writer holds on any replica fails at once, naming the replica and the
  holder, or with ``wait`` is waited for;
- :meth:`ReplicaLeases.check`, right before a commit: the primary's lease as before
  (:meth:`Lease.check`); on another replica, a lease another writer holds now fails the
  commit, and one that expired while its replica did not answer is taken again if it answers
  now (a replica that still does not answer is left to the write quorum, as its writes are).

Every request to a replica other than the primary is bounded by ``answer_s``: a hung replica
costs a writer that long at its start, at its commit check and at its release, not the
minutes its client's retries would.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from storage.io.lease import (
    ANSWER_S,
    DEFAULT_TTL_S,
    BrokenLeaseError,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    call_within,
    hold,
    take,
    unlock_command,
)
from storage.io.lease_record import Holder, positive_seconds
from storage.io.urls import Location, display_url

if TYPE_CHECKING:
    from storage.io.replicas.replica_set import ReplicaSet


@dataclass
class _Secondary:
    """The lease on a replica other than the primary, or why there is none (yet)."""

    name: str
    loc: Location
    lease: Lease | None = None
    #: who else holds this replica's lease, found after ours was skipped or lost ("": none)
    rival: str = ""
    #: a request to take the lease has not come back yet (a hung replica)
    busy: bool = False


class ReplicaLeases:
    """The output's writer lease on each of its replicas; see the module docstring.

    ``primary`` is the primary's :class:`Lease` (its run id is every replica's);
    :meth:`check` before a commit, :meth:`release` at the end (also on failure).
    """

    def __init__(self, primary: Lease, secondaries: list[_Secondary],
                 answer_s: float = ANSWER_S) -> None:
        self.primary, self.secondaries, self.answer_s = primary, secondaries, answer_s
        self._stop = threading.Event()
        #: a lease taken in the background is kept or released under it, never missed by
        #: a release() that runs at the same time
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if any(s.lease is None for s in secondaries):
            self._thread = threading.Thread(target=self._catch_up_loop, daemon=True,
                                            name="shardflow-lease-replicas")
            self._thread.start()

    @property
    def run_id(self) -> str:
        return self.primary.run_id

    @property
    def held_on(self) -> list[str]:
        """``"primary"`` and the names of the other replicas whose lease is held now."""
        return ["primary"] + [s.name for s in self.secondaries
                              if s.lease is not None and s.lease.held and not s.lease.lost]

    def _take(self, s: _Secondary, expired: Lease | None) -> None:
        """Take ``s``'s lease if it is free, stale or ours, else note the rival; runs on its
        own thread, which a hung replica may hold long after the caller stopped waiting.
        ``expired``: our lease there that lapsed unrenewed, let go of first."""
        try:
            if expired is not None:
                expired.release()
            lease = Lease(s.loc, ttl_s=self.primary.ttl_s, run_id=self.run_id)
            other = lease.try_acquire()
            if isinstance(other, Holder):
                s.rival = other.describe()
            elif other is not None:
                pass  # an invalid lease, not stale yet: the next pass tries again
            else:
                with self._lock:  # one decision against release(): kept and released, or
                    kept = not self._stop.is_set()  # let go of here, never neither
                    if kept:
                        lease.start_renewing()
                        s.lease = lease
                if not kept:
                    lease.release()  # came back after the writer let go
        except Exception:  # still refusing: the next pass tries again
            pass
        finally:
            s.busy = False

    def _catch_up(self) -> None:
        """Try, once and at most ``answer_s``, the replicas whose lease is not held: skipped
        at the start, or expired while they did not answer."""
        started = []
        for s in self.secondaries:
            if s.rival or s.busy:
                continue
            expired = None
            if s.lease is not None:
                if not s.lease.lost:
                    continue
                if s.lease.lost.startswith("taken over by "):
                    s.rival = s.lease.lost.removeprefix("taken over by ")
                    continue
                expired, s.lease = s.lease, None  # lapsed unrenewed: taken again if free
            s.busy = True
            thread = threading.Thread(target=self._take, args=(s, expired), daemon=True,
                                      name="shardflow-lease-take")
            thread.start()
            started.append(thread)
        for thread in started:
            thread.join(self.answer_s)

    def _catch_up_loop(self) -> None:
        while not self._stop.wait(self.primary.ttl_s / 3):
            self._catch_up()

    def _rival_now(self, s: _Secondary) -> str:
        """Who other than this run the replica's lease names now (``""``: us, nobody, or no
        answer in time)."""
        if s.lease is None:
            return ""
        with contextlib.suppress(Exception):
            found = call_within(self.answer_s, s.lease.look, s.name)
            if not found.absent and (found.holder is None or found.holder.run_id != self.run_id):
                return (found.holder.describe() if found.holder else
                        f"an invalid lease ({found.invalid})")
        return ""

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless no other writer holds the lease of any
        replica that answers: call it right before committing."""
        self.primary.check()
        self._catch_up()
        for s in self.secondaries:
            s.rival = s.rival or self._rival_now(s)
            if s.rival:
                raise LeaseLostError(
                    f"the writer lease on {s.name} is held by another writer ({s.rival}); "
                    "it may be writing that replica, so this run stops before its commit; if "
                    f"that writer is gone: {unlock_command(display_url(s.loc.url))}")

    def release(self) -> None:
        """Release every lease held, the other replicas' side by side and within
        ``answer_s`` (best effort: a lease left behind expires)."""
        with self._lock:
            self._stop.set()
            releasing = [threading.Thread(target=s.lease.release, daemon=True)
                         for s in self.secondaries if s.lease is not None]
        for thread in releasing:
            thread.start()
        self.primary.release()
        for thread in releasing:
            thread.join(self.answer_s)
        if self._thread is not None:
            self._thread.join(self.answer_s)


def _order_key(loc: Location) -> str:
    """One order for every writer: a replica's URL (credentials are never in it)."""
    return loc.url


def hold_replicas(store: ReplicaSet, what: str, ttl_s: float = DEFAULT_TTL_S,
                  wait: bool = False, log: TextIO | None = None,
                  answer_s: float = ANSWER_S) -> ReplicaLeases:
    """The writer lease of ``store``'s output on each of its replicas, taken for ``what``
    ("run", "gc", "repair", ...) and renewed until :meth:`ReplicaLeases.release`.

    Fails like :func:`storage.io.lease.hold` on the primary (unreachable or silent: one line;
    held: :class:`LeaseHeldError`, or a wait with ``wait``), and with :class:`LeaseHeldError`
    naming the replica when another writer holds any other replica's lease; the leases taken
    so far are released then.
    """
    log = log or sys.stderr
    ttl_s = positive_seconds("the lease TTL", ttl_s)  # before any replica is touched
    answer_s = positive_seconds("the lease answer time", answer_s)
    run_id = uuid.uuid4().hex[:16]  # one run id on every replica
    order = sorted(range(len(store.replicas)), key=lambda i: _order_key(store.replicas[i].loc))
    if not wait:  # nobody blocks on us: the primary first, so one that is down touches nothing
        order = [0] + [i for i in order if i]
    primary: Lease | None = None
    secondaries = {i: _Secondary(r.name, r.loc) for i, r in enumerate(store.replicas) if i}
    try:
        for i in order:
            replica = store.replicas[i]
            if i == 0:
                primary = hold(replica.loc, replica.name, what, ttl_s=ttl_s, wait=wait, log=log,
                               run_id=run_id, answer_s=answer_s)
            else:
                _take_secondary(secondaries[i], run_id, what, ttl_s, wait, log, answer_s)
    except BaseException:
        for s in secondaries.values():
            if s.lease is not None:
                s.lease.release()
        if primary is not None:
            primary.release()
        raise
    assert primary is not None
    return ReplicaLeases(primary, [secondaries[i] for i in sorted(secondaries)], answer_s)


def _take_secondary(s: _Secondary, run_id: str, what: str, ttl_s: float, wait: bool,
                    log: TextIO, answer_s: float) -> None:
    """Take a non-primary replica's lease (before or after the primary's, in URL order); one
    that refuses or does not answer is left to the background catch-up."""
    try:
        s.lease = take(s.loc, what, ttl_s, wait, log, run_id, answer_s)
    except (LeaseHeldError, BrokenLeaseError):
        raise
    except Exception as exc:
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"shardflow: {s.name} did not answer for its writer lease ({detail[:200]}); "
              "the lease is taken there once it answers", file=log, flush=True)
