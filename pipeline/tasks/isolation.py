"""A partition whose task was lost with its worker runs again with each record's steps in a
process of its own: the record that kills or hangs that process is quarantined, the rest
carry on, and the run commits.

**When.** Phase 1 asks the scheduler, at the start of a task, how many workers it lost while
they ran this task (:func:`lost_attempts`: Dask's own count, ``TaskState.suspicious``, which
a worker that leaves cleanly does not raise). Zero: the records run in the worker
(:class:`pipeline.tasks.record_steps.RecordSteps`). One or more: they run in isolation
(:class:`IsolatedSteps`). Without this, a record that crashes its worker (a fault in a C
extension) or holds it past the worker TTL (a parser holding the GIL) took four workers down
one after the other, and the run ended in ``KilledWorker``.

**How.** One child process (``python -m pipeline.tasks.isolation_child``) runs the steps; the
worker sends it one record at a time over a pipe and waits for its answer under the limits
(:class:`pipeline.tasks.record_steps.RecordLimits`): the child arms the same CPU guard as a worker
(``SIGPROF`` past ``cpu_s``), the worker ends it past ``wall_s`` or when it holds more than
the memory limit. A child that dies or is ended names its record poison:
``record_cpu_limit``, ``record_time_limit``, ``record_memory_limit`` or ``record_crashed``
(with the signal or exit status), quarantined as ``file@offset`` like any bad record; a
fresh child takes the next record. Everything else (dedup keys, tokenizing, the shard) stays
in the worker, as in a normal attempt.

**Why the output does not depend on it.** The child runs the same code on the same records,
so every record that is not poison gives the same text, counts and metadata, and the shards
are the same bytes. A record is poison only if it fails in isolation: a worker lost by
chance (killed, out of memory because of another process, a record slow only because the
machine was busy) makes the partition run in isolation, where all its records pass, and the
result is the one a normal attempt gives. A record that does fail in isolation cannot finish
in a worker either: a crash crashes both; past ``cpu_s`` of CPU the worker's guard ends the
worker first; past the memory limit the worker's nanny does. What stays open is a record
within a few percent of ``cpu_s``, which a faster or slower CPU can put either side: the
limit is ~10,000 times a normal page's cost and 4 times the costliest real record measured, so
only a hostile or broken record comes near it; and one that waits, using no CPU, for minutes
(``wall_s`` is for isolation only: in a worker nothing ends such a wait unless it holds the
GIL, and then the worker TTL does).
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.steps.columns import Columns
from pipeline.steps.contract import merge_reports
from pipeline.tasks.record_steps import Poisoned, RecordLimits, RecordSteps

if TYPE_CHECKING:
    from pipeline.records import Document
    from pipeline.steps.recipe import Recipe

#: how long a fresh child may take to start (imports, the URL block-list) under load
START_S = 120.0
#: how often the worker looks at a child's memory and the clock while it waits
TICK_S = 0.05
#: memory for the child where the worker has no Dask memory limit: this share of the machine
UNLIMITED_SHARE = 0.5
_HEADER = struct.Struct("<Q")


def guarded_worker() -> bool:
    """Whether this code runs in a task of a one-thread Dask worker: where ending the process
    is safe (the scheduler runs its tasks again) and the process's CPU timer is this task's
    alone (tasks on other threads would re-arm and disarm it)."""
    try:
        from distributed import get_worker

        return get_worker().state.nthreads == 1
    except (ImportError, ValueError, AttributeError):
        return False


def lost_attempts() -> int:
    """How many workers the scheduler lost while they ran the current task (0 outside a
    Dask task, or when the scheduler cannot be asked: the task then runs as it always did).

    One round trip to the scheduler a task (~1 ms). The function sent is a closure, so the
    scheduler needs no Shardflow code to run it."""
    try:
        from distributed import get_client, get_worker

        key = get_worker().get_current_task()
    except (ImportError, ValueError):
        return 0

    def suspicious(dask_scheduler: Any) -> int:
        task = dask_scheduler.tasks.get(key)
        return int(getattr(task, "suspicious", 0) or 0)

    try:
        return int(get_client().run_on_scheduler(suspicious, callback_timeout=60))
    except Exception:
        return 0


def steps_for(recipe: Recipe, storage_options: dict[str, Any] | None, limits: RecordLimits,
              what: str = "") -> RecordSteps | IsolatedSteps:
    """The steps a task runs its records through: in isolation when the scheduler lost a
    worker while it ran this task before (one line on stderr says so, naming ``what``),
    else here, under the CPU guard in a one-thread worker."""
    lost = lost_attempts()
    if lost:
        print(f"shardflow: {what or 'a task'} was lost with {lost} worker(s): its records run "
              "one at a time in isolation", file=sys.stderr, flush=True)
        return IsolatedSteps(recipe, storage_options, limits)
    return RecordSteps(recipe, storage_options,
                       cpu_s=limits.cpu_s if guarded_worker() else None)


def memory_limit(limits: RecordLimits) -> int:
    """The bytes the isolation child may hold (see :attr:`RecordLimits.memory_bytes`)."""
    if limits.memory_bytes:
        return limits.memory_bytes
    try:
        from distributed import get_worker

        limit = get_worker().memory_manager.memory_limit
        if limit:
            return int(limit)
    except (ImportError, ValueError, AttributeError):
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * UNLIMITED_SHARE)


def send(fd: int, obj: Any) -> None:
    """One length-prefixed pickle on a pipe (blocking)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def receive(fd: int) -> Any:
    """One message from :func:`send` (blocking); ``EOFError`` at the end of the pipe."""
    size = _HEADER.unpack(_read_exactly(fd, _HEADER.size))[0]
    return pickle.loads(_read_exactly(fd, size))


def _read_exactly(fd: int, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError("pipe closed")
        out += chunk
    return bytes(out)


def _rss(pid: int) -> int:
    """A process's resident bytes (``/proc``; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Ended(Exception):
    """The child died or was ended while it held a record."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _how_it_died(code: int, cpu_s: float) -> _Ended:
    if code == -signal.SIGPROF:
        return _Ended("record_cpu_limit", f"its steps ran past {cpu_s:g} s of CPU time")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return _Ended("record_crashed", f"the process running its steps died of {name}")
    return _Ended("record_crashed", f"the process running its steps exited with status {code}")


class _Child:
    """One ``pipeline.tasks.isolation_child`` process and its two pipes."""

    def __init__(self, init: dict[str, Any]) -> None:
        to_child, self.requests = os.pipe()
        self.replies, from_child = os.pipe()
        root = str(Path(__file__).resolve().parents[2])  # where ``pipeline`` is importable
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.tasks.isolation_child", str(to_child),
                 str(from_child)], pass_fds=(to_child, from_child), env=env,
                stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            os.close(to_child)
            os.close(from_child)
        self.cpu_s = float(init["cpu_s"])
        with contextlib.suppress(OSError):  # a child that died at once: the first ask says so
            send(self.requests, ("init", init))

    def ask(self, message: Any, wall_s: float, memory: int) -> Any:
        """Send ``message`` and wait for the answer under the limits; raises
        :class:`_Ended` (the child is then gone)."""
        try:
            send(self.requests, message)
        except OSError:  # it died before reading (BrokenPipeError)
            raise self._ended(None) from None
        deadline = time.monotonic() + wall_s
        buf = bytearray()
        need = _HEADER.size
        size = None
        waiting = select.poll()  # not select(): a worker's descriptors may pass FD_SETSIZE
        waiting.register(self.replies, select.POLLIN)
        while True:
            if waiting.poll(TICK_S * 1000):
                chunk = os.read(self.replies, max(1 << 16, need - len(buf)))
                if not chunk:
                    raise self._ended(None)
                buf += chunk
                if size is None and len(buf) >= _HEADER.size:
                    size = _HEADER.unpack(bytes(buf[:_HEADER.size]))[0]
                    need = _HEADER.size + size
                if size is not None and len(buf) >= need:
                    return pickle.loads(bytes(buf[_HEADER.size:need]))
                continue
            if time.monotonic() > deadline:
                raise self._ended(_Ended("record_time_limit",
                                         f"its steps ran past {wall_s:g} s"))
            held = _rss(self.proc.pid)
            if held > memory:
                raise self._ended(_Ended("record_memory_limit",
                                         f"its steps held {held:,} bytes, more than {memory:,}"))

    def _ended(self, why: _Ended | None) -> _Ended:
        """End the child (if ``why``) and say how it ended."""
        if why is not None:
            self.proc.kill()
        code = self.proc.wait()
        self.close()
        return why or _how_it_died(code, self.cpu_s)

    def close(self) -> None:
        for fd in (self.requests, self.replies):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.requests = self.replies = -1
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)  # it exits at the end of its input
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class IsolatedSteps:
    """:class:`pipeline.tasks.record_steps.RecordSteps`'s interface, each record's steps run in a
    child process under ``limits``: a record that ends the child raises :class:`Poisoned`
    (its steps counted nothing), and the next record gets a fresh child."""

    def __init__(self, recipe: Recipe, storage_options: dict[str, Any] | None,
                 limits: RecordLimits) -> None:
        self.init = {"recipe": recipe, "storage_options": storage_options,
                     "cpu_s": limits.cpu_s}
        self.limits = limits
        self.memory = memory_limit(limits)
        self.metadata = recipe.metadata
        self.dropped: Counter[str] = Counter()
        self.changed: Counter[str] = Counter()
        self.poisoned = 0
        #: the steps' reports of children that ended, merged; and the live child's last
        self._reports: dict[str, dict[str, Any]] = {}
        self._child_reports: dict[str, dict[str, Any]] = {}
        self._child: _Child | None = None
        self._last: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        #: the last record a step dropped: ``(step, reason)`` (the lineage's drop record)
        self.last_drop: tuple[str, str] | None = None
        #: the shard's columns, gathered here (the child's declared signals: its first answer)
        self.columns: Columns | None = None

    def _ask(self, message: Any, wall_s: float) -> Any:
        if self._child is None:
            self._child = _Child(self.init)
            try:
                ready = self._check(self._child.ask(("ready",), START_S, self.memory))
                if self.columns is None:
                    self.columns = Columns(self.metadata, ready[1])
            except _Ended as ended:
                self._child = None
                raise RuntimeError(f"the isolation process did not start: {ended.detail}") \
                    from None
        try:
            return self._check(self._child.ask(message, wall_s, self.memory))
        except _Ended as ended:
            self._child = None
            self._retire_reports()
            self.poisoned += 1
            raise Poisoned(ended.reason, ended.detail) from None

    @staticmethod
    def _check(reply: Any) -> Any:
        """A child's error (an exception in the steps) is raised here, as it would have been
        raised in the worker: the task fails and Dask retries it."""
        if reply[0] == "error":
            raise RuntimeError(f"in isolation: {reply[1]}")
        return reply

    #: one record at a time, always: a batch's poison record would end the others' child
    batch_size = 1

    def __call__(self, doc: Document) -> str | None:
        reply = self._ask(("doc", doc), self.limits.wall_s)
        if reply[0] == "poisoned":
            raise Poisoned(reply[1], reply[2])
        _, text, columns, dropped, changed, reports, drop = reply
        self.dropped.update(dropped)
        self.changed.update(changed)
        if reports is not None:
            self._child_reports = reports
        self._last = columns
        if text is None:
            self.last_drop = (str(drop[0]), str(drop[1])) if drop else None
        return text

    def idle(self) -> None:
        """Nothing to do: the guard is the child's."""

    def keep(self) -> None:
        if self._last is not None and self.columns is not None:
            self.columns.add(*self._last)

    def signal_types(self) -> dict[str, str]:
        return self.columns.described() if self.columns is not None else {}

    def take(self) -> dict[str, Any] | None:
        if self.columns is None:  # no record reached a child: nothing kept
            return None
        return self.columns.take()

    def _retire_reports(self) -> None:
        """The ended child's reports join those of the children before it (in record
        order: a child runs the records after its predecessor's)."""
        for name, report in self._child_reports.items():
            merge_reports(self._reports.setdefault(name, {}), report)
        self._child_reports = {}

    def reports(self) -> dict[str, dict[str, Any]]:
        """The steps' reports over every child so far."""
        out = copy.deepcopy(self._reports)
        for name, report in self._child_reports.items():
            merge_reports(out.setdefault(name, {}), copy.deepcopy(report))
        return out

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None
        self._retire_reports()
