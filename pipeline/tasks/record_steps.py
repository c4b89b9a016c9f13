"""What phase 1 does to one record between the reader and the tokenizer, and its limits.

The steps are the run's recipe (:mod:`pipeline.steps`: the cleaner, or the web steps around
it, and any user steps), run by :class:`pipeline.steps.chain.StepChain`. They are the part of a
record's work that depends on what the record holds, and where a hostile record can cost
without bound (a parser in C holding the GIL, a regular expression), so they run with two
limits, the same in a worker and in isolation (:mod:`pipeline.tasks.isolation`):

- **complexity**: an HTML page nested too deeply for the extractor is refused before it is
  extracted (:func:`pipeline.web.extract.refusal`, in the ``extract`` step), as
  :data:`TOO_COMPLEX`;
- **CPU time**: in a one-thread Dask worker (the default), a record whose steps run past
  ``cpu_s`` seconds of the process's CPU time ends the process (``SIGPROF``: the kernel's
  timer, which needs no GIL). Dask then runs the partition again, and that attempt runs each
  record in a process of its own (:class:`pipeline.tasks.isolation.IsolatedSteps`), where the same
  limit decides whether the record is poison. Outside a worker (a test calling phase 1
  directly) nothing is armed.

:class:`RecordSteps` runs them here; :class:`pipeline.tasks.isolation.IsolatedSteps` has the same
interface and runs them in a child process. Phase 1 and the tokenizer-training sample use
either.
"""

from __future__ import annotations

import signal
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from cyclopts import Parameter

from pipeline.config_field import flag
from pipeline.steps.chain import Outcome, StepChain
from pipeline.steps.contract import Poisoned
from pipeline.steps.recipe import Recipe
from pipeline.steps.web import TOO_COMPLEX
from storage.io.lease_record import positive_seconds

if TYPE_CHECKING:
    from pipeline.records import Document

__all__ = ["TOO_COMPLEX", "CpuGuard", "Poisoned", "RecordLimits", "RecordSteps"]
#: the CPU time one record's steps may take: ~10,000x a typical page's (6 ms), 4x the costliest
#: legitimate record measured (8 MB of text through gopher_repetition: 14.7 s), 25x the worst
#: page the complexity check admits (8 MB of 125-deep chains: 2.3 s)
RECORD_CPU_S = 60.0
#: the wall time one record may take in isolation (a record that waits without using CPU)
RECORD_WALL_S = 300.0


#: records a recipe with a batch step (a model scorer) hands its steps at a time
BATCH_DOCS = 64
#: the longest record limit accepted (a day)
MAX_RECORD_S = 86_400.0


@dataclass
class RecordLimitFlags:
    """The limits on one record's steps as ``pipeline run`` flags (recorded in the manifest
    only when changed: they decide which records are poison)."""

    record_cpu_s: Annotated[float, Parameter(metavar="SECONDS")] = flag(
        RECORD_CPU_S, "CPU seconds one record's cleaning and web steps may take (~10,000x a "
        "typical page); a record past it ends its worker and, retried in isolation, is "
        "quarantined as record_cpu_limit", manifest=False)  # see PipelineConfig.for_manifest
    record_wall_s: Annotated[float, Parameter(metavar="SECONDS")] = flag(
        RECORD_WALL_S, "wall seconds one record may take when its partition is retried record "
        "by record in isolation (record_time_limit)", manifest=False)

    def check_record_limits(self) -> None:
        positive_seconds("--record-cpu-s", self.record_cpu_s, MAX_RECORD_S)
        positive_seconds("--record-wall-s", self.record_wall_s, MAX_RECORD_S)


@dataclass(frozen=True)
class RecordLimits:
    """The limits on one record's steps (pickled with every phase-1 task)."""

    #: CPU seconds (a worker's process is ended past it; in isolation, the record is poison)
    cpu_s: float = RECORD_CPU_S
    #: wall seconds, in isolation only
    wall_s: float = RECORD_WALL_S
    #: bytes the isolation process may hold (0: the worker's Dask memory limit, else half
    #: the machine's memory): a worker past its own limit is ended by its nanny
    memory_bytes: int = 0


class CpuGuard:
    """Ends this process once ``seconds`` of its CPU time pass after :meth:`arm` without a
    :meth:`disarm` or another :meth:`arm` (``ITIMER_PROF``, whose ``SIGPROF`` ends the process
    where nothing handles it). Off when ``seconds`` is ``None`` or a handler is installed."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds or 0.0
        self.on = bool(seconds) and hasattr(signal, "setitimer") \
            and signal.getsignal(signal.SIGPROF) == signal.SIG_DFL
        self.armed = False

    def arm(self) -> None:
        if self.on:
            signal.setitimer(signal.ITIMER_PROF, self.seconds)
            self.armed = True

    def disarm(self) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_PROF, 0)
            self.armed = False


class RecordSteps:
    """The recipe's steps in this process. ``cpu_s``: arm a :class:`CpuGuard` at each record
    (only where ending the process is how a record is stopped: a Dask worker, the isolation
    child).

    The guard is re-armed at each record and disarmed by :meth:`idle` (phase 1 calls it
    before each tokenizer batch and at the end): one system call a record, ~1 us."""

    def __init__(self, recipe: Recipe, storage_options: dict[str, Any] | None = None,
                 cpu_s: float | None = None) -> None:
        self.chain = StepChain(recipe, storage_options)
        self.columns = self.chain.columns()
        self.guard = CpuGuard(cpu_s)
        if self.guard.on:
            self.chain.warm_up()

    def __call__(self, doc: Document) -> str | None:
        """The record's text after the steps, ``None`` when a step drops it (counted);
        raises :class:`Poisoned` for a record a step refuses or raises on."""
        self.guard.arm()
        return self.chain(doc)

    @property
    def batch_size(self) -> int:
        """Records phase 1 hands :meth:`run` at a time: :data:`BATCH_DOCS` when a step has a
        ``batch`` method, else 1 (each record through :meth:`__call__`)."""
        return BATCH_DOCS if self.chain.batched else 1

    def run(self, docs: list[Document]) -> list[Outcome]:
        """A batch of records through the steps (:meth:`StepChain.run`), under one arming of
        the CPU guard: a batch past it ends the worker, and the partition's retry runs each
        record alone in isolation, where the limit is the record's own."""
        self.guard.arm()
        return self.chain.run(docs)

    def settle(self, outcome: Outcome) -> str | None:
        """One record's outcome of :meth:`run`, as :meth:`__call__` would have returned it
        (its columns ready for :meth:`keep`; a poisoned record raises)."""
        return self.chain.settle(outcome)

    def idle(self) -> None:
        """No record's steps run until the next call: the CPU guard is off."""
        self.guard.disarm()

    @property
    def last_drop(self) -> tuple[str, str] | None:
        """The last record a step dropped: ``(step, reason)`` (the lineage's drop record)."""
        return self.chain.last_drop

    @property
    def last(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The last document that passed: its metadata row and signals."""
        return self.chain.last

    def keep(self) -> None:
        """The last document that passed is kept (its columns go to the next batch)."""
        self.columns.add(*self.chain.last)

    def take(self) -> dict[str, Any] | None:
        """The columns of the documents kept since the last call (``None``: only tokens)."""
        return self.columns.take()

    def signal_types(self) -> dict[str, str]:
        """The signal columns written so far and their Parquet types."""
        return self.columns.described()

    @property
    def dropped(self) -> Counter[str]:
        return self.chain.dropped

    @property
    def changed(self) -> Counter[str]:
        return self.chain.changed

    def reports(self) -> dict[str, dict[str, Any]]:
        """The steps' reports so far (:meth:`StepChain.reports`)."""
        return self.chain.reports()

    def close(self) -> None:
        self.idle()
        self.chain.close()
