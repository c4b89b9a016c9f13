"""The pure planner: run now or wait, and never miss the deadline by waiting."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from infra.energy import Segment, decide

H = 3600.0


def hourly(values: list[float], start: float = 0.0) -> list[Segment]:
    return [Segment(start + i * H, start + (i + 1) * H, v) for i, v in enumerate(values)]


def test_waits_for_the_cleanest_window_that_fits() -> None:
    trace = hourly([300, 300, 300, 100, 100, 200, 300, 300])
    d = decide(trace, 0.0, 2 * H, 8 * H)
    assert not d.run and d.until == 3 * H and (d.now_g, d.next_g) == (300, 100)
    assert decide(trace, 3 * H, 2 * H, 8 * H).run
    # 3 h needed: hours 3, 4 and then 5 (200) are the cleanest; 3 h of them start at hour 3
    assert decide(trace, 0.0, 3 * H, 8 * H).until == 3 * H


def test_the_deadline_wins_over_a_cleaner_window() -> None:
    trace = hourly([300, 300, 250, 100])
    d = decide(trace, 0.0, 2 * H, 4 * H)
    assert d.run is False and d.until == 2 * H  # hours 2 and 3: the latest start
    assert decide(hourly([300, 300, 300, 100]), 0.0, 2 * H, 4 * H).run  # a tie: now wins
    assert decide(trace, 2 * H, 2 * H, 4 * H).run  # at the latest start: run, dirty or not
    assert decide(trace, 0.0, 5 * H, 4 * H).reason == "deadline"  # cannot fit: run at once


def test_threshold_mode() -> None:
    trace = hourly([300, 250, 90, 300])
    d = decide(trace, 0.0, H, 4 * H, max_intensity=100)
    assert not d.run and d.until == 2 * H and d.next_g == 90
    assert decide(trace, 2 * H, H, 4 * H, max_intensity=100).run
    d = decide(trace, 0.0, H, 10 * H, max_intensity=10)  # never that clean: the latest start
    assert not d.run and d.until == 9 * H and d.next_g is None
    assert decide(hourly([50]), 0.0, H, 2 * H, max_intensity=100).run


def test_no_forecast_for_now_means_run() -> None:
    assert decide(hourly([100], start=H), 0.0, 60.0, 10 * H).run


def _simulate(trace: list[Segment], start: float, need: float, deadline: float,
              threshold: float | None) -> float:
    """Run a job that needs ``need`` s, re-planning at every decision's end and at every
    forecast boundary; the finish time."""
    bounds = sorted({s.start for s in trace} | {s.end for s in trace})
    t, left = start, need
    for _ in range(10_000):
        if left <= 1e-9:
            return t
        d = decide(trace, t, left, deadline, threshold)
        if d.run:
            nxt = min([b for b in bounds if b > t + 1e-9] + [t + left])
            ran = min(left, nxt - t)
            t, left = t + ran, left - ran
        else:
            assert d.until is not None and d.until > t  # a wait always moves time on
            t = d.until
    raise AssertionError("no progress")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 800), min_size=1, max_size=48), st.integers(0, 47),
       st.integers(1, 24), st.integers(0, 24), st.one_of(st.none(), st.integers(0, 800)))
def test_the_schedule_never_misses_the_deadline(values: list[int], start_h: int, need_h: int,
                                                slack_h: int, threshold: int | None) -> None:
    trace = hourly([float(v) for v in values])
    start, need = start_h * H + 600.0, need_h * H
    deadline = start + need + slack_h * H  # any trace, any start, any feasible deadline
    end = _simulate(trace, start, need, deadline, threshold)
    assert end <= deadline + 1e-6
