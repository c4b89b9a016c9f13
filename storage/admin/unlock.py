"""``python -m storage unlock``: show each replica's writer lease, and break the ones that no
live writer holds.

Why: a lease whose writer died on another host blocks every writer until it expires, and an
invalid one (a crafted or damaged file, a folder in its place) until a waiting writer has seen
it for a TTL; an operator needs to see who holds it and to clear it now. Breaking a lease that
a live writer holds would let a second writer share its ``_work/``, so this command breaks, on
every replica it names (as gc and repair address them), only what is certainly not a live
writer's:

- an invalid lease (:mod:`storage.io.lease_record` says why), or an expired one;
- a lease whose holder is confirmed dead: it ran on this host (same host name and pid
  namespace) and its pid no longer exists.

A fresh lease of a writer on another host cannot be confirmed dead from here: it is shown and
left alone unless ``--force`` (with a warning), as is one whose process still runs here. A
broken lease's writer, if it was alive after all, loses it: its commit check refuses to
commit. Each break goes through the take-over protocol (:func:`storage.io.lease.break_lease`),
so a writer taking the same lease over at the same moment is never undone; each replica gets
:data:`storage.io.lease.ANSWER_S` to answer, so a hung one is reported, not waited for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from storage.format.layout import LEASE
from storage.io.lease import (
    ANSWER_S,
    DEFAULT_TTL_S,
    break_lease,
    call_within,
    unlock_command,
)
from storage.io.lease_record import Found, read_lease
from storage.io.replicas.replica_set import ReplicaSet
from storage.io.urls import Location, display_url

#: what happened to one replica's lease
NONE, BROKEN, WOULD_BREAK, LEFT, CHANGED, FAILED = (
    "no lease", "broken", "would be broken", "left alone", "changed", "failed")


@dataclass
class ReplicaUnlock:
    """One replica's lease: what it is, what was decided and done, and why."""

    name: str
    url: str
    shown: str = ""
    outcome: str = NONE
    why: str = ""
    note: str = ""


@dataclass
class UnlockReport:
    """What ``storage unlock`` found and did on each replica."""

    replicas: list[ReplicaUnlock] = field(default_factory=list)
    #: lines for stderr: each lease broken with ``--force``
    warnings: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0: no lease is left in the way (or, with --dry-run, none would be); 1: a lease was
        left alone or changed meanwhile; 2: a replica could not be read or cleared."""
        outcomes = {r.outcome for r in self.replicas}
        return 2 if FAILED in outcomes else 1 if outcomes & {LEFT, CHANGED} else 0

    def render(self) -> str:
        lines = []
        for r in self.replicas:
            lines.append(f"{r.name}: {r.shown}")
            if r.outcome != NONE:
                detail = "; ".join(x for x in (r.why, r.note) if x)
                lines.append(f"  {r.outcome}{': ' + detail if detail else ''}")
        return "\n".join(lines)


def _verdict(found: Found, force: bool) -> tuple[bool, str, str]:
    """(may it be broken, why, a warning when only ``force`` allows it)."""
    holder = found.valid
    if holder is None:
        return True, "it is invalid", ""
    if holder.expires <= time.time():
        return True, "it has expired", ""
    if holder.confirmed_dead():
        return True, f"its holder is gone (pid {holder.pid} no longer runs on this host)", ""
    if holder.is_local_process():
        why = f"its holder still runs on this host (pid {holder.pid} is alive)"
    else:
        why = (f"its holder runs on host {holder.host}, so it cannot be confirmed dead from "
               "here, and the lease is fresh")
    if not force:
        return False, why, ""
    return True, f"--force ({why})", (
        f"breaking the writer lease of a writer that may still run ({holder.describe()}): "
        "if it does, it finds its lease gone and stops at its commit check, but until then "
        "it and the next writer share the output's _work/")


def _one(name: str, url: str, loc: Location, force: bool, dry_run: bool, answer_s: float,
         ttl_s: float, report: UnlockReport) -> ReplicaUnlock:
    r = ReplicaUnlock(name, url)
    try:
        found: Found = call_within(answer_s, lambda: read_lease(loc, LEASE),
                                   f"{name}'s lease")
    except Exception as exc:  # noqa: BLE001 - one replica's failure is reported, not raised
        r.shown, r.outcome = "its lease could not be read", FAILED
        r.why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return r
    if found.absent:
        r.shown = "no writer lease"
        return r
    if found.valid is not None:
        r.shown = f"writer lease of {found.valid.describe()}"
    else:
        held = f" (it names {found.holder.describe()})" if found.holder is not None else ""
        r.shown = f"an invalid writer lease: {found.invalid}{held}"
    ok, r.why, warning = _verdict(found, force)
    if not ok:
        r.outcome = LEFT
        r.note = f"if you know that writer is gone: {unlock_command(url)} --force"
        return r
    if dry_run:
        r.outcome = WOULD_BREAK
        return r
    try:
        done, note = call_within(answer_s, lambda: break_lease(loc, found, ttl_s),
                                 f"breaking {name}'s lease")
    except Exception as exc:  # noqa: BLE001 - reported per replica
        r.outcome = FAILED
        r.note = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return r
    if not done:
        r.outcome = CHANGED
        r.note = ("the lease changed, or a writer was taking it over, while it was being "
                  "broken; run this again to see the lease now")
        return r
    r.outcome, r.note = BROKEN, note
    if warning:
        report.warnings.append(f"{name}: {warning}")
    return r


def unlock(store: ReplicaSet, force: bool = False, dry_run: bool = False,
           answer_s: float = ANSWER_S, ttl_s: float = DEFAULT_TTL_S) -> UnlockReport:
    """Show and, where allowed (see the module docstring), break the writer lease of every
    replica of ``store``; ``dry_run``: show what would be done, break nothing."""
    report = UnlockReport()
    for replica in store.replicas:
        url = display_url(replica.loc.url)
        report.replicas.append(_one(replica.name, url, replica.loc, force, dry_run, answer_s,
                                    ttl_s, report))
    return report
