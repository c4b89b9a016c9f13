"""Hang detection: every rank's progress, watched from outside the step loop.

A rank that dies is torchrun's business; a rank that *hangs* (a stuck read, a deadlocked
collective, a SIGSTOPped or swapped-out process) blocks every other rank in the next collective
until the process group's timeout, silently. This module turns such a hang into a restart:

* The loop calls :func:`beat` at each phase boundary (``data``, ``step``, ``save``...): an
  attribute write and a counter bump, nothing more.
* A daemon thread per rank (the *sidecar*) publishes that record to the rendezvous store
  (``hb/<rank>``) every ``interval`` seconds, with a tick counter of its own, so a watcher can
  tell "the main thread is stuck" (ticks go on, the progress counter does not) from "the whole
  process is frozen or gone" (ticks stop too).
* Two ranks (0 and the last, so that one frozen monitor is not the end of it) also *watch*:
  they read every rank's record, note on their own monotonic clock when its progress counter
  last changed (no clock is compared across hosts) and apply :func:`judge`.
* :func:`judge` (pure) blames the rank furthest behind, by (step, phase): in a synchronous job
  the others soon wait for it inside a collective, so their progress stops too, but they are
  ahead. A hang is declared when that rank has made no progress for ``--hang-timeout`` (or
  ``--hang-timeout-io`` in the start, first-step, checkpoint load/save and finish phases,
  which may legitimately take minutes: no false alarm while a checkpoint is written).
* The first watcher to write the verdict (``compare_set`` on one key) logs one line naming the
  rank, its host, pid, step and last phase; the hung rank's stack is dumped: by the rank
  itself when its sidecar still runs, or runs again once a watcher on its host sent a stopped
  process ``SIGCONT``; by ``SIGUSR1``, which :mod:`faulthandler` handles in C, for a process
  frozen otherwise (its GIL held in a long C call) on the watcher's host; then
  every rank that can still run exits with :data:`HANG_EXIT_CODE`, and ``torchrun
  --max-restarts`` restarts the job from its last checkpoint.

Store keys live under the attempt's prefix (:func:`trainer.distributed.heartbeat_store`), so a
restarted job never reads the previous attempt's records.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

#: Exit status of every rank of a job torn down for a hang (EX_TEMPFAIL: "try again").
HANG_EXIT_CODE = 75

#: Order of the phases within one step: the rank with the smallest (step, order) is behind.
PHASE_ORDER = {"start": 0, "load": 0, "first-step": 1, "data": 1, "step": 2, "save": 3,
               "finish": 4, "done": 5}
#: Phases that may legitimately take long (I/O, compilation): judged by ``timeout_io``.
IO_PHASES = frozenset({"start", "load", "first-step", "save", "finish"})

VERDICT_KEY = "verdict"
#: How long a watcher waits, holding the GIL, for the hung process to dump its stack: by its
#: C handler (``SIGUSR1``), or by its own sidecar once continued (then until it exits).
SIGNAL_DUMP_WAIT_S = 0.5
SELF_DUMP_WAIT_S = 5.0


@dataclass(frozen=True)
class Beat:
    """One rank's published record."""

    rank: int
    seq: int  # bumped by every beat() of the main thread
    tick: int  # bumped by every publication of the sidecar
    phase: str
    step: int
    host: str
    pid: int

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: bytes | str) -> Beat:
        return cls(**json.loads(text))


@dataclass
class Seen:
    """What a watcher knows of one rank: the last record and, on the watcher's clock, when its
    progress counter and its tick counter last changed."""

    beat: Beat
    progress_at: float
    tick_at: float


@dataclass(frozen=True)
class Verdict:
    rank: int
    host: str
    pid: int
    phase: str
    step: int
    idle_s: float  # seconds without progress, on the watcher's clock
    silent: bool  # its sidecar stopped publishing too: the process is frozen or gone
    by: int = -1  # the watching rank
    #: The watcher dumps its stack by ``SIGUSR1`` (frozen, not stopped, on the watcher's
    #: host); otherwise the rank dumps its own when its sidecar runs (again).
    signalled: bool = False

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: bytes | str) -> Verdict:
        return cls(**json.loads(text))

    def message(self) -> str:
        state = ("its process does not respond (frozen, stopped or gone)" if self.silent
                 else "its process runs, its training thread does not move")
        return (f"trainer: hang: rank {self.rank} on host {self.host} (pid {self.pid}) made no "
                f"progress for {self.idle_s:.1f} s, last phase '{self.phase}' at step "
                f"{self.step}; {state}; tearing the job down (exit {HANG_EXIT_CODE}) for a "
                f"restart from the last checkpoint")


def limit_for(phase: str, timeout: float, timeout_io: float) -> float:
    return timeout_io if phase in IO_PHASES else timeout


def judge(seen: dict[int, Seen], now: float, timeout: float, timeout_io: float,
          silent_after: float) -> Verdict | None:
    """The hung rank, if any. Pure: the watcher feeds it its observations and its clock.

    The rank blamed is the one furthest behind by (step, phase order); among equals, one whose
    sidecar went silent, then the one idle longest. It is declared hung once idle for longer
    than its phase's limit. Ranks that finished (``done``) are left out."""
    live = {r: s for r, s in seen.items() if s.beat.phase != "done"}
    if not live:
        return None

    def key(item: tuple[int, Seen]) -> tuple[int, int, bool, float, int]:
        r, s = item
        silent = now - s.tick_at > silent_after
        return (s.beat.step, PHASE_ORDER.get(s.beat.phase, 2), not silent, s.progress_at, r)

    rank, s = min(live.items(), key=key)
    idle = now - s.progress_at
    if idle <= limit_for(s.beat.phase, timeout, timeout_io):
        return None
    b = s.beat
    return Verdict(rank=rank, host=b.host, pid=b.pid, phase=b.phase, step=b.step, idle_s=idle,
                   silent=now - s.tick_at > silent_after)


def _stderr() -> Any:
    """Where stacks go: stderr, or the process's original one where it was replaced by an
    object without a file descriptor (faulthandler writes to the descriptor)."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return sys.__stderr__


def dump_stacks(out: Any) -> None:
    """Every thread's stack, worded as faulthandler words it, read through
    ``sys._current_frames()``: frame objects made under the GIL, not faulthandler's C walk of
    other threads' frames, which once broke off after the first thread's header in a rank just
    continued from SIGSTOP (it died of SIGSEGV there, and the dump named no frame)."""
    me = threading.get_ident()
    lines: list[str] = []
    for ident, frame in sys._current_frames().items():
        lines.append(f"{'Current thread' if ident == me else 'Thread'} 0x{ident:016x} "
                     "(most recent call first):")
        # newest first; no source lines read (file I/O would let the other threads run)
        stack = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False)
        lines += [f'  File "{f.filename}", line {f.lineno} in {f.name}' for f in stack]
        lines.append("")
    out.write("\n".join(lines) + "\n")
    out.flush()


def tick_interval(timeout: float) -> float:
    """How often records are published and checked: a tenth of the timeout, in [0.2, 2] s."""
    return min(2.0, max(0.2, timeout / 10))


def process_stopped(pid: int) -> bool:
    """True when ``pid`` is in the stopped state (``T``: SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class Heartbeat:
    """This rank's sidecar (and, on watching ranks, the watcher). :meth:`start` once the
    process group is up; :meth:`beat` from the loop; :meth:`stop` at the end."""

    def __init__(self, store: Any, rank: int, world_size: int, *, timeout: float,
                 timeout_io: float, watch: bool | None = None,
                 exit_fn: Callable[[int], None] = os._exit,
                 log: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.rank, self.world_size = rank, world_size
        self.timeout, self.timeout_io = timeout, timeout_io
        self.interval = tick_interval(timeout)
        self.watch = rank in (0, world_size - 1) if watch is None else watch
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.seq, self.phase, self.step, self.tick = 0, "start", 0, 0
        self.exit_fn = exit_fn
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.verdict: Verdict | None = None
        self._seen: dict[int, Seen] = {}
        self._store_ok_at = time.monotonic()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._published_io = True
        self._publish_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="shardflow-heartbeat",
                                        daemon=True)

    # --- main thread -----------------------------------------------------------------------

    def beat(self, phase: str, step: int | None = None) -> None:
        """Progress: called by the training thread at phase boundaries. Cheap (no I/O): the
        sidecar publishes it at its next tick. When the phase's limit changes (into or out of
        a save, a load, the first step) this thread publishes it itself, before it goes on:
        left to the sidecar, a rank frozen right after a checkpoint (before the sidecar got
        the GIL, as on a loaded host) was judged by the long I/O limit (30 s instead of 5 s
        in a CI run of tests/trainer/test_hang.py). A store error here is left to the
        sidecar, which handles a store that hangs or is gone."""
        self.phase = phase
        if step is not None:
            self.step = step
        self.seq += 1
        if (phase in IO_PHASES) != self._published_io:
            try:
                self._publish()
            except Exception:  # noqa: BLE001 - the sidecar retries and judges the store
                self._wake.set()

    def start(self) -> Heartbeat:
        # SIGUSR1 dumps every thread's stack to stderr, in C (works while the main thread is
        # blocked in a collective): how a watcher gets the stack of a rank that cannot dump
        # its own.
        faulthandler.register(signal.SIGUSR1, file=_stderr(), all_threads=True, chain=False)
        now = time.monotonic()
        for r in range(self.world_size):  # not heard of yet: starting up, since now
            self._seen[r] = Seen(Beat(r, -1, -1, "start", 0, "?", 0), now, now)
        self._publish()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Done: publish ``done`` (watchers leave this rank out) and stop the thread."""
        self.beat("done")
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):  # the store may be gone at teardown
            self._publish()

    # --- sidecar thread --------------------------------------------------------------------

    def _publish(self) -> None:
        with self._publish_lock:  # the training thread publishes limit changes itself
            self.tick += 1
            b = Beat(self.rank, self.seq, self.tick, self.phase, self.step, self.host,
                     self.pid)
            self._published_io = b.phase in IO_PHASES
            self.store.set(f"hb/{self.rank}", b.dumps())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._publish()
                if self.store.check([VERDICT_KEY]):
                    self._teardown(Verdict.loads(self.store.get(VERDICT_KEY)), mine=False)
                    return
                if self.watch:
                    self._watch()
                    if self.verdict is not None:
                        return
                self._store_ok_at = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - the store itself may hang or be gone
                if self._stop.is_set():
                    return
                if time.monotonic() - self._store_ok_at > max(self.timeout, 10 * self.interval):
                    self.log(f"trainer: hang: rank {self.rank} on host {self.host} cannot "
                             f"reach the rendezvous store for "
                             f"{time.monotonic() - self._store_ok_at:.1f} s ({exc}); its host "
                             f"(torchrun's agent, or rank 0) may be hung; exiting "
                             f"{HANG_EXIT_CODE}")
                    self.exit_fn(HANG_EXIT_CODE)
                    return

    def _watch(self) -> None:
        now = time.monotonic()
        keys = [f"hb/{r}" for r in range(self.world_size)]
        present = [k for k in keys if self.store.check([k])]
        for raw in self.store.multi_get(present) if present else []:
            b = Beat.loads(raw)
            old = self._seen[b.rank]
            progress_at = now if b.seq != old.beat.seq else old.progress_at
            tick_at = now if b.tick != old.beat.tick else old.tick_at
            self._seen[b.rank] = Seen(b, progress_at, tick_at)
        verdict = judge(self._seen, now, self.timeout, self.timeout_io,
                        silent_after=max(3 * self.interval, 1.0))
        if verdict is None:
            return
        signalled = (verdict.silent and verdict.host == self.host
                     and not process_stopped(verdict.pid))
        verdict = Verdict(**{**asdict(verdict), "by": self.rank, "signalled": signalled})
        text = verdict.dumps()
        won = self.store.compare_set(VERDICT_KEY, "", text)
        won = won.decode() if isinstance(won, bytes) else won
        self._teardown(Verdict.loads(won), mine=won == text)

    def _teardown(self, verdict: Verdict, *, mine: bool) -> None:
        """Everyone who still runs: dump the hung rank's stack once, then exit."""
        self.verdict = verdict
        if mine:
            self.log(verdict.message())
        if verdict.rank == self.rank and not verdict.signalled:
            # From Python, holding the GIL: no other thread moves its frames meanwhile.
            self.log(f"trainer: hang: stack of rank {self.rank} (pid {self.pid}):")
            dump_stacks(_stderr())
        elif mine and verdict.silent and verdict.host == self.host:
            self._signal_hung(verdict.pid, verdict.signalled)
        self.exit_fn(HANG_EXIT_CODE)

    def _signal_hung(self, pid: int, signalled: bool) -> None:
        """A frozen process on this host. Not stopped (its GIL held in a long C call, swapped
        out): ``SIGUSR1``, which its faulthandler handles in C as soon as it runs; the threads
        that wait for its GIL do not move their frames meanwhile. Stopped (SIGSTOP, a
        debugger): only ``SIGCONT``, and its own sidecar, which sees the verdict at its next
        tick, dumps its stack from Python and exits. (A ``SIGUSR1`` there ran the C handler
        while the continued threads moved the very frames it walked: a CI run's dump broke
        off mid-stack and the rank died of SIGSEGV; torchrun's SIGTERM would kill a stopped
        process at once, without any dump.) Until that process is gone (or a bound passes)
        this thread holds the GIL, so that this rank's training thread cannot go on with the
        continued one meanwhile: at most the collective in flight completes."""
        try:
            if signalled:
                os.kill(pid, signal.SIGUSR1)
            elif process_stopped(pid):
                self.log(f"trainer: hang: pid {pid} is stopped (SIGSTOP or a debugger); it is "
                         f"continued to dump its stack")
                os.kill(pid, signal.SIGCONT)
        except OSError:
            return
        sys.setswitchinterval(10.0)
        until = time.monotonic() + (SIGNAL_DUMP_WAIT_S if signalled else SELF_DUMP_WAIT_S)
        while time.monotonic() < until:  # busy on purpose: sleeping would release the GIL
            try:
                os.kill(pid, 0)  # no syscall that releases the GIL: kill() keeps it
            except OSError:  # gone (reaped by torchrun's agent): its dump is complete
                return


_current: Heartbeat | None = None


def install(hb: Heartbeat | None) -> None:
    """Make ``hb`` the process's heartbeat (what :func:`beat` reports to)."""
    global _current
    _current = hb


def current() -> Heartbeat | None:
    return _current


def beat(phase: str, step: int | None = None) -> None:
    """Report progress to this process's heartbeat; a no-op when none runs (tests, no flag)."""
    if _current is not None:
        _current.beat(phase, step)
