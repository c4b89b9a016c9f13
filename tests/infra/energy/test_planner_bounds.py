"""The planner never answers with an infinite wait (infra/energy/planner.py): a threshold no
piece of the forecast meets, without a deadline, waits until the forecast runs out (where an
unknown intensity means run), not until ``inf`` (the gate's clock text of ``inf`` was an
OverflowError: ``--max-intensity 0`` without ``--deadline``)."""

from __future__ import annotations

import math

from infra.energy import Segment, decide

H = 3600.0


def test_an_unmet_threshold_without_a_deadline_waits_until_the_forecast_ends() -> None:
    trace = [Segment(0.0, H, 300.0), Segment(H, 3 * H, 200.0)]
    d = decide(trace, 600.0, 60.0, math.inf, max_intensity=0.0)
    assert not d.run and d.until == 3 * H and d.next_g is None
    assert decide(trace, 3 * H, 60.0, math.inf, max_intensity=0.0).run  # no forecast: run


def test_a_gap_in_the_forecast_ends_the_wait_there() -> None:
    trace = [Segment(0.0, H, 300.0), Segment(2 * H, 3 * H, 200.0)]
    d = decide(trace, 0.0, 60.0, math.inf, max_intensity=0.0)
    assert not d.run and d.until == H


def test_a_met_threshold_or_a_deadline_keep_their_answers() -> None:
    trace = [Segment(0.0, H, 300.0), Segment(H, 2 * H, 50.0)]
    assert decide(trace, 0.0, 60.0, math.inf, max_intensity=100.0).until == H
    d = decide(trace, 0.0, H, 10 * H, max_intensity=10.0)  # the latest start, as before
    assert d.until == 9 * H
