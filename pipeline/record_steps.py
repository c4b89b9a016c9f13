"""What phase 1 does to one record between the reader and the tokenizer, and its limits.

The steps are the cleaner, or the web steps around it (URL block-list, HTML extraction,
cleaner, language, rules, PII: :class:`pipeline.web.WebSteps`). They are the part of a
record's work that depends on what the record holds, and where a hostile record can cost
without bound (a parser in C holding the GIL, a regular expression), so they run with two
limits, the same in a worker and in isolation (:mod:`pipeline.isolation`):

- **complexity**: an HTML page nested too deeply for the extractor is refused before it is
  extracted (:func:`pipeline.web.extract.refusal`), as :data:`TOO_COMPLEX`;
- **CPU time**: in a one-thread Dask worker (the default), a record whose steps run past
  ``cpu_s`` seconds of the process's CPU time ends the process (``SIGPROF``: the kernel's
  timer, which needs no GIL). Dask then runs the partition again, and that attempt runs each
  record in a process of its own (:class:`pipeline.isolation.IsolatedSteps`), where the same
  limit decides whether the record is poison. Outside a worker (a test calling phase 1
  directly) nothing is armed.

:class:`RecordSteps` runs them here; :class:`pipeline.isolation.IsolatedSteps` has the same
interface and runs them in a child process. Phase 1 and the tokenizer-training sample use
either.
"""

from __future__ import annotations

import signal
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.cleaning import Cleaner, CleaningConfig

if TYPE_CHECKING:
    from pipeline.records import Document
    from pipeline.web import WebConfig

#: quarantine reason of a page refused by the complexity check
TOO_COMPLEX = "extract_too_complex"
#: the CPU time one record's steps may take: ~10,000x a typical page's (6 ms), 4x the costliest
#: legitimate record measured (8 MB of text through gopher_repetition: 14.7 s), 25x the worst
#: page the complexity check admits (8 MB of 125-deep chains: 2.3 s)
RECORD_CPU_S = 60.0
#: the wall time one record may take in isolation (a record that waits without using CPU)
RECORD_WALL_S = 300.0


class Poisoned(Exception):
    """A record refused by a limit: quarantined under ``reason`` with ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


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


_WARMED: set[str] = set()


def warm_up(web: WebConfig | None) -> None:
    """Load, once per process, what the web steps load on first use (the HTML parser and
    extractor, the language model: ~0.5 s of CPU), so that the first record's CPU time is its
    own, in a worker as in isolation."""
    if web is None:
        return
    if "parser" not in _WARMED:
        from pipeline.web.extract import html_to_text

        html_to_text("<html><body><p>Warming up the parser.</p></body></html>")
        _WARMED.add("parser")
    if (web.languages or web.identify) and "langid" not in _WARMED:
        from pipeline.web.langid import identify

        identify("Warming up the language model.")
        _WARMED.add("langid")


class RecordSteps:
    """The steps in this process. ``cpu_s``: arm a :class:`CpuGuard` at each record (only
    where ending the process is how a record is stopped: a Dask worker, the isolation child).

    The guard is re-armed at each record and disarmed by :meth:`idle` (phase 1 calls it
    before each tokenizer batch and at the end): one system call a record, ~1 us."""

    def __init__(self, cleaning: CleaningConfig, web: WebConfig | None = None,
                 storage_options: dict[str, Any] | None = None,
                 cpu_s: float | None = None) -> None:
        from pipeline.web import WebSteps

        self.cleaner = Cleaner(cleaning)
        self.web = WebSteps(web, storage_options) if web is not None else None
        self.guard = CpuGuard(cpu_s)
        if self.guard.on:
            warm_up(web)

    def __call__(self, doc: Document) -> str | None:
        """The record's text after the steps, ``None`` when a step drops it (counted);
        raises :class:`Poisoned` for a page too complex to extract."""
        self.guard.arm()
        if self.web is None:
            return self.cleaner(doc.text)
        if doc.kind == "html" and not self._blocked(doc):
            from pipeline.web.extract import refusal

            why = refusal(doc.text)
            if why is not None:
                raise Poisoned(TOO_COMPLEX, why)
        return self.web(doc, self.cleaner)

    def _blocked(self, doc: Document) -> bool:
        """Whether the web steps drop ``doc`` by its URL before extracting it (its complexity
        is then not looked at: it is counted as ``url_blocked``, as without the check)."""
        if self.web is None or not self.web.blocklist:
            return False
        from pipeline.web.urls import blocked

        return blocked(doc.url, self.web.blocklist)

    def idle(self) -> None:
        """No record's steps run until the next call: the CPU guard is off."""
        self.guard.disarm()

    def keep(self) -> None:
        """The last document that passed is kept (its metadata goes to the next batch)."""
        if self.web is not None:
            self.web.keep()

    def take(self) -> dict[str, list[Any]] | None:
        """The metadata columns of the documents kept since the last call (``None``: none
        are written)."""
        return self.web.take() if self.web is not None else None

    @property
    def dropped(self) -> Counter[str]:
        return self.cleaner.dropped + (self.web.dropped if self.web else Counter())

    @property
    def changed(self) -> Counter[str]:
        return self.cleaner.changed + (self.web.changed if self.web else Counter())

    def close(self) -> None:
        self.idle()
        if self.web is not None:
            from pipeline.web.extract import forget

            forget()
