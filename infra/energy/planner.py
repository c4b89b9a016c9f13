"""When to run: pure planning over a carbon-intensity forecast (no clock, no I/O).

Times are seconds (any epoch: the caller's clock); a forecast is a list of
:class:`Segment` (start, end, gCO2e/kWh). :func:`decide` answers, at ``now``, for a job that
still needs ``need_s`` seconds of running and must end by ``deadline``: run now, or wait until
a given time.

- Lowest windows (no ``max_intensity``): pick the cleanest pieces of time between now and the
  deadline that together last ``need_s`` (greedy on intensity; the earlier piece wins a tie);
  run now iff now is in one of them, else wait until the first of them.
- Threshold (``max_intensity``): run iff the intensity now is at or below it, else wait until
  the next piece that is (without a deadline and with no such piece: until the forecast
  runs out, where an unknown intensity means run; never an infinite ``until``, which
  crashed the waiting line's clock with an ``OverflowError``).

Either way the job never waits past the latest start, ``deadline - need_s``: at it (or when
the need no longer fits) the answer is run, whatever the intensity. So a job whose need was
estimated right finishes by its deadline, however it was paused on the way (property-tested in
tests/infra/energy/test_planner.py). Time the forecast does not cover counts as usable but
dirtiest (it is chosen last), and an unknown intensity now means run: a missing forecast
never holds a job back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    g_per_kwh: float


@dataclass(frozen=True)
class Decision:
    run: bool
    #: while waiting: when to run (at the latest); while running: None
    until: float | None
    #: intensity now (None: the forecast does not cover now)
    now_g: float | None
    #: the intensity of the window waited for (None when running or unknown)
    next_g: float | None
    reason: str


def intensity_at(forecast: Sequence[Segment], t: float) -> float | None:
    for s in forecast:
        if s.start <= t < s.end:
            return s.g_per_kwh
    return None


def _pieces(forecast: Sequence[Segment], now: float, deadline: float
            ) -> list[tuple[float, float, float]]:
    """(start, end, g) covering [now, deadline): forecast pieces clipped to it, and the gaps
    (g = inf: unknown, used last)."""
    out: list[tuple[float, float, float]] = []
    t = now
    for s in sorted(forecast, key=lambda s: s.start):
        lo, hi = max(s.start, t), min(s.end, deadline)
        if hi <= lo:
            continue
        if lo > t:
            out.append((t, lo, math.inf))
        out.append((lo, hi, s.g_per_kwh))
        t = hi
    if t < deadline:
        out.append((t, deadline, math.inf))
    return out


def decide(forecast: Sequence[Segment], now: float, need_s: float, deadline: float,
           max_intensity: float | None = None) -> Decision:
    now_g = intensity_at(forecast, now)
    latest = deadline - need_s
    if need_s <= 0 or now >= latest:
        return Decision(True, None, now_g, None, "deadline")
    if now_g is None:
        return Decision(True, None, None, None, "no forecast for now")
    pieces = _pieces(forecast, now, deadline)
    if max_intensity is not None:
        if now_g <= max_intensity:
            return Decision(True, None, now_g, None, "under threshold")
        nxt = next(((s, g) for s, _e, g in pieces if g <= max_intensity), None)
        until = min(latest, nxt[0]) if nxt else latest
        if math.isinf(until):  # no deadline, no clean piece: until the forecast runs out
            until = next((s for s, _e, g in pieces if math.isinf(g)), until)
        return Decision(False, until, now_g, nxt[1] if nxt and nxt[0] <= latest else None,
                        "over threshold")
    chosen = []
    left = need_s
    for start, end, g in sorted(pieces, key=lambda p: (p[2], p[0])):
        if left <= 0:
            break
        chosen.append((start, g))
        left -= end - start
    if any(start <= now for start, _g in chosen):
        return Decision(True, None, now_g, None, "cleanest window")
    start, g = min(chosen)
    until = min(latest, start)
    return Decision(False, until, now_g, g if start <= latest and math.isfinite(g) else None,
                    "cleaner window ahead")
