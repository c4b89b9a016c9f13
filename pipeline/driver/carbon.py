"""Energy and carbon for ``pipeline run``: what the run costs, and when it may start new work.

:class:`RunEnergy` measures the run: a snapshot (:func:`infra.energy.snapshot`) of the driver
and, through ``client.run``, of every Dask worker, every :data:`infra.energy.meter.SAMPLE_S`
and at each stage boundary, taken by a background thread (the driver never waits on a worker
for it). Joules go to the stage that was running (the task window names stages by their task
keys: ``sample_texts``, ``phase1``, the shuffle's steps, ``phase2``); gCO2e use the signal's
intensity at each sample (else ``--grid-intensity``). The pipeline uses no accelerator, so only
CPU packages are measured (RAPL where readable) or estimated.

:class:`CarbonGate` is the admission decision: before the task window submits a task it asks
the gate, which asks the pure planner (:func:`infra.energy.decide`) whether to run now given
the forecast, the work left and the deadline. While it says wait, the window lets its live
tasks finish and then the driver sleeps, printing why and until when; it never waits past the
latest start that still meets the deadline. The work left is estimated from the run's own
progress (running time x the share of tasks left), before the first results from the input's
size at :data:`PRIOR_BYTES_PER_S` per worker thread, with a margin (:func:`need_with_margin`).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Annotated, Any, TextIO

from cyclopts import Parameter

from infra.energy import WATTS_PER_CORE, Accumulator, Energy, Signal, decide, grams, snapshot
from infra.energy.meter import SAMPLE_S
from infra.energy.planner import Decision, intensity_at
from pipeline.config_field import flag
from storage import Manifest

#: before the first results: the work left is the input's bytes at this rate per worker
#: thread (GPT-2 cleaning + tokenizing runs at 1-3 MB/s per core; the lower end is the safe side)
PRIOR_BYTES_PER_S = 1 << 20
#: the planner plans for this much more than the estimate, plus :data:`MARGIN_S`
MARGIN = 1.5
MARGIN_S = 60.0
#: a waiting driver re-reads the forecast and re-plans at least this often
RECHECK_S = 1.0

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: the furthest a duration deadline may lie ahead (``--deadline 3650d``)
MAX_DEADLINE_S = 10 * 366 * 86400.0


def parse_deadline(text: str, now: float) -> float:
    """``24h``, ``90m``, ``2d``, ``3600s`` (from ``now``), or an ISO 8601 time (UTC when it
    names no zone) -> a POSIX time."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m:
        span = float(m.group(1)) * _UNITS[m.group(2)]
        if not span <= MAX_DEADLINE_S:  # 1e400d is inf: its clock text was an OverflowError
            raise ValueError(f"deadline {text!r}: at most {MAX_DEADLINE_S / 86400:,.0f} days "
                             "ahead")
        return now + span
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"deadline {text!r}: expected a duration (24h, 90m, 2d, 3600s) or an "
                         "ISO 8601 time (2026-12-02T06:00Z)") from None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


@dataclass
class CarbonFlags:
    """Energy and carbon, as ``pipeline run`` flags (none of them changes the output bytes)."""

    carbon_signal: Annotated[str | None, Parameter(metavar="SRC")] = flag(
        None, "carbon-intensity forecast (gCO2e/kWh) to read and re-read while the run goes: "
        "a file or URL in the Carbon Aware SDK's or Electricity Maps' JSON (README, "
        "'Energy and carbon'); with --deadline or --max-intensity it decides when new tasks "
        "start", manifest=False)
    deadline: Annotated[str | None, Parameter(metavar="WHEN")] = flag(
        None, "with --carbon-signal: start new tasks only in the cleanest windows that still "
        "finish by then: 24h, 90m, 2d (from now) or an ISO 8601 time", manifest=False)
    max_intensity: Annotated[float | None, Parameter(metavar="G")] = flag(
        None, "with --carbon-signal: start new tasks only while the intensity is at most G "
        "g/kWh (bounded by --deadline when given)", manifest=False)
    grid_intensity: Annotated[float | None, Parameter(metavar="G")] = flag(
        None, "grid intensity in gCO2e/kWh for the run's carbon figure where no signal covers "
        "the time", manifest=False)
    watts_per_core: float = flag(WATTS_PER_CORE, "the energy estimate's watts per busy core, "
                                 "used where RAPL cannot be read", manifest=False)
    record_energy: bool = flag(False, "record the run's energy in the manifest's "
                               "stats.energy (a measurement: a rerun's manifest is then no "
                               "longer byte-identical)", manifest=False)

    def check_carbon(self) -> None:
        if (self.deadline or self.max_intensity is not None) and not self.carbon_signal:
            raise ValueError("--deadline and --max-intensity need --carbon-signal")
        if self.deadline:
            parse_deadline(self.deadline, 0.0)  # validates
        if self.watts_per_core <= 0 or any(
                g is not None and g < 0 for g in (self.max_intensity, self.grid_intensity)):
            raise ValueError("watts_per_core must be positive and intensities >= 0")


def need_with_margin(estimate_s: float) -> float:
    return estimate_s * MARGIN + MARGIN_S


def _clock_text(t: float, now: float) -> str:
    """``t`` as a wall-clock time for a log line (the date too when not today)."""
    try:
        here, today = datetime.fromtimestamp(t).astimezone(), datetime.fromtimestamp(now)
    except (OverflowError, OSError, ValueError):  # inf, NaN, or past year 9999
        return "an unknown time"
    fmt = "%H:%M:%S" if t - now < 600 else "%H:%M"
    return here.strftime(fmt if here.date() == today.date() else f"%Y-%m-%d {fmt}")


def _span(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def waiting_line(d: Decision, now: float, max_intensity: float | None) -> str:
    """The progress line of a pause."""
    assert d.until is not None
    what = (f"intensity <= {max_intensity:g} g/kWh" if max_intensity is not None
            else "a cleaner window")
    line = f"carbon: waiting for {what} until {_clock_text(d.until, now)}"
    if d.now_g is not None:
        line += f", {d.now_g:.0f} g/kWh now"
    if d.next_g is not None:
        line += f", {d.next_g:.0f} g/kWh forecast"
    return line


class CarbonGate:
    """``gate(block)`` for :class:`pipeline.driver.window.TaskWindow`: True to admit a task now.
    ``block``: the window has no live task, so wait here (sleeping, re-planning every
    ``recheck_s``) until the planner says run. ``signal``: anything with ``forecast()`` (a
    :class:`infra.energy.Signal`; the replay benchmark passes a simulated feed)."""

    def __init__(self, signal: Any, deadline: float | None, max_intensity: float | None,
                 log: TextIO, prior_s: float = 0.0, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, recheck_s: float = RECHECK_S
                 ) -> None:
        self.signal, self.deadline, self.max_intensity = signal, deadline, max_intensity
        self.log, self.prior_s, self.clock, self.sleep = log, prior_s, clock, sleep
        self.recheck_s = recheck_s
        self.progress: Callable[[], float] = lambda: 0.0
        self.started = clock()
        self.waited_s = 0.0
        self.pauses = 0
        self._decision: Decision | None = None
        self._decided_at = -float("inf")
        self._said = ""

    def need_s(self) -> float:
        """Running time still needed, with the margin."""
        done = min(1.0, max(0.0, self.progress()))
        ran = self.clock() - self.started - self.waited_s
        if done >= 0.02 and ran > 0:
            estimate = ran * (1 - done) / done
        else:
            estimate = self.prior_s * (1 - done)
        return need_with_margin(estimate)

    def decision(self) -> Decision:
        now = self.clock()
        d = self._decision
        if d is None or now - self._decided_at >= 1.0 or (d.until is not None and now >= d.until):
            deadline = self.deadline if self.deadline is not None else float("inf")
            d = decide(self.signal.forecast(), now, self.need_s(), deadline, self.max_intensity)
            self._decision, self._decided_at = d, now
        return d

    def __call__(self, block: bool) -> bool:
        d = self.decision()
        if d.run:
            self._resumed()
            return True
        if not block:
            return False
        start = self.clock()
        self.pauses += 1
        try:
            while not d.run:
                now = self.clock()
                line = waiting_line(d, now, self.max_intensity)
                if line != self._said:
                    print(line, file=self.log, flush=True)
                    self._said = line
                assert d.until is not None
                self.sleep(max(0.05, min(self.recheck_s, d.until - now)))
                self._decision = None
                d = self.decision()
        finally:
            self.waited_s += self.clock() - start
        self._resumed()
        return True

    def _resumed(self) -> None:
        if self._said:
            g = self._decision.now_g if self._decision else None
            print("carbon: running again" + (f" at {g:.0f} g/kWh" if g is not None else "")
                  + f" (paused {_span(self.waited_s)} in all)", file=self.log, flush=True)
            self._said = ""


class RunEnergy:
    """The run's energy, whole and per stage (see the module's text)."""

    def __init__(self, watts_per_core: float, intensity: Callable[[float], float | None],
                 period_s: float = SAMPLE_S) -> None:
        self.acc = Accumulator(watts_per_core)
        self.intensity = intensity
        self.period_s = period_s
        self.stages: dict[str, Energy] = {}
        self.stage = "setup"
        self.gco2e = 0.0
        self.gco2e_joules = 0.0  # the joules gCO2e were counted for (an intensity was known)
        self.client: Any = None
        self._next_stage: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._add([snapshot()])

    def _add(self, batch: list[dict[str, Any]]) -> None:
        with self._lock:
            before = self.acc.total
            d = self.acc.add(batch) - before
            self.stages[self.stage] = self.stages.get(self.stage, Energy()) + d
            g = self.intensity(time.time())
            if g is not None:
                self.gco2e += grams(d.joules, g)
                self.gco2e_joules += d.joules
            if self._next_stage is not None:
                self.stage, self._next_stage = self._next_stage, None

    def sample(self) -> None:
        batch = [snapshot()]
        if self.client is not None:
            # a worker leaving mid-sample: the next sample counts its successor
            with contextlib.suppress(Exception):
                batch += list(self.client.run(snapshot).values())
        self._add(batch)

    def attach(self, client: Any) -> None:
        """Start sampling the cluster's workers too (every ``period_s``, in a thread)."""
        self.client = client
        self._thread = threading.Thread(target=self._loop, name="shardflow-energy",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.period_s)
            self._wake.clear()
            if self._stop.is_set() or getattr(self.client, "status", "") == "closed":
                return
            self.sample()

    def on_stage(self, name: str) -> None:
        """A new stage began: sample soon (in the thread), counting what came before to the
        stage before."""
        if name == self.stage:
            return
        if self._thread is None:
            with self._lock:
                self._next_stage = name
            self.sample()
            return
        with self._lock:
            self._next_stage = name
        self._wake.set()

    def finish(self, timeout_s: float = 5.0) -> Energy:
        """A last sample (with the workers, while they still run) and the total. A hung
        worker must not hold the run's end: after ``timeout_s`` the run goes on without the
        last interval of the workers' counters (the next sample is never taken)."""
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(1.0)
            done = threading.Thread(target=self.sample, daemon=True)
            done.start()
            done.join(timeout_s)
        else:
            self.sample()
        return self.acc.total

    def record(self, tokens: int, grid_intensity: float | None = None) -> dict[str, Any]:
        """``stats.energy``: the whole run (:meth:`infra.energy.Energy.record`), gCO2e by the
        intensity of each sample's time, and ``stages``: joules, source and seconds each."""
        with self._lock:
            total = self.acc.total
            rec = total.record(tokens)
            grams_ = self.gco2e
            if grid_intensity is not None:  # the rest at the constant
                grams_ += grams(total.joules - self.gco2e_joules, grid_intensity)
            if self.gco2e_joules > 0 or grid_intensity is not None:
                rec["gco2e"] = round(grams_, 6)
                if total.joules > 0:
                    rec["grid_g_per_kwh"] = round(grams_ / total.joules * 3.6e6, 3)
            rec["stages"] = {name: {"joules": round(e.joules, 3), "source": e.source,
                                    "seconds": round(e.seconds, 3)}
                             for name, e in self.stages.items() if e.seconds > 0 or e.joules}
        return rec


def render(rec: dict[str, Any]) -> list[str]:
    """The run summary's lines for ``rec`` (:meth:`RunEnergy.record`)."""
    label = {"estimate": "ESTIMATE: CPU time x watts per core, not measured"}.get(
        rec["source"], f"measured: {rec['source']}")
    line = f"energy       {rec['joules']:,.1f} J ({label})"
    if "joules_per_token" in rec:
        line += f", {rec['joules_per_token'] * 1e3:.4f} mJ/token"
    lines = [line]
    if "gco2e" in rec:
        lines.append(f"carbon       {rec['gco2e']:.4f} gCO2e at {rec['grid_g_per_kwh']:.0f} g/kWh")
    stages = rec.get("stages", {})
    if stages:
        lines.append("  by stage   " + ", ".join(f"{k} {v['joules']:,.1f} J"
                                                for k, v in stages.items()))
    return lines


class CarbonRun:
    """What ``pipeline run`` needs from this module, set up from its config."""

    def __init__(self, cfg: Any, log: TextIO) -> None:
        self.log = log
        now = time.time()
        self.deadline = parse_deadline(cfg.deadline, now) if cfg.deadline else None
        self.signal = Signal(cfg.carbon_signal, warn=lambda m: print(m, file=log)) \
            if cfg.carbon_signal else None
        self.grid_intensity = cfg.grid_intensity
        self.max_intensity = cfg.max_intensity
        self.gate: CarbonGate | None = None
        self.energy = RunEnergy(cfg.watts_per_core, self._intensity)
        if self.signal is not None:
            g = intensity_at(self.signal.segments, now)
            last = max(s.end for s in self.signal.segments)
            print(f"carbon: signal {self.signal.name}: "
                  + (f"{g:.0f} g/kWh now" if g is not None else "no value for now")
                  + f", forecast to {_clock_text(last, now)}", file=log)

    def _intensity(self, t: float) -> float | None:
        if self.signal is not None:
            g = intensity_at(self.signal.forecast(), t)
            if g is not None:
                return g
        return self.grid_intensity

    def attach(self, client: Any, window: Any, input_bytes: int, threads: int) -> None:
        """Measure the cluster and, with a deadline or a threshold, gate the window."""
        self.energy.attach(client)
        window.on_stage = self.energy.on_stage
        if self.signal is not None and (self.deadline is not None
                                        or self.max_intensity is not None):
            prior = input_bytes / (PRIOR_BYTES_PER_S * max(1, threads))
            self.gate = CarbonGate(self.signal, self.deadline, self.max_intensity, self.log,
                                   prior)
            window.gate = self.gate

    def track(self, bar: Any) -> None:
        if self.gate is not None:
            self.gate.progress = lambda: bar.done / bar.total if bar.total else 1.0

    def finish(self) -> Energy:
        return self.energy.finish()

    def record(self, tokens: int) -> dict[str, Any]:
        rec = self.energy.record(tokens, self.grid_intensity)
        if self.gate is not None:
            rec["waited_s"] = round(self.gate.waited_s, 3)
            if self.deadline is not None:
                rec["deadline"] = datetime.fromtimestamp(self.deadline, timezone.utc) \
                    .isoformat(timespec="seconds")
                rec["met_deadline"] = time.time() <= self.deadline
        return rec


def with_energy(manifest: Manifest, rec: dict[str, Any]) -> Manifest:
    """``manifest`` with ``stats.energy``."""
    return replace(manifest, stats={**manifest.stats, "energy": rec})
