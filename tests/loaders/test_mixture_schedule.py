"""Mixture schedules, pure: the counts per step follow the schedule, the lanes are dealt the
same whoever asks, and nothing drifts (properties over random schedules)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loaders.mixture_schedule import (
    LaneDeal,
    Schedule,
    catch_up,
    cumulative_counts,
    rotation_multiplier,
    scheduled_shares,
)

weight = st.one_of(st.just(0.0), st.floats(0.01, 100.0))


@st.composite
def schedules(draw: st.DrawFn, max_components: int = 5) -> Schedule:
    n = draw(st.integers(1, max_components))
    gaps = draw(st.lists(st.integers(1, 300), max_size=4))
    steps = [0]
    for g in gaps:
        steps.append(steps[-1] + g)
    points = []
    for s in steps:
        w = draw(st.lists(weight, min_size=n, max_size=n))
        if not sum(w) > 0:
            w[draw(st.integers(0, n - 1))] = 1.0
        points.append((s, w))
    return Schedule.of(points, draw(st.sampled_from(["step", "linear"])))


def shares_by_definition(schedule: Schedule, k: int) -> list[float]:
    """The shares of step ``k`` as the module docstring states them, one step at a time."""
    p = max(i for i, s in enumerate(schedule.steps) if s <= k)
    here = [w / sum(schedule.weights[p]) for w in schedule.weights[p]]
    if schedule.ramp == "step" or p == len(schedule.steps) - 1:
        return here
    there = [w / sum(schedule.weights[p + 1]) for w in schedule.weights[p + 1]]
    f = (k - schedule.steps[p]) / (schedule.steps[p + 1] - schedule.steps[p])
    return [a + (b - a) * f for a, b in zip(here, there, strict=True)]


@given(schedules(), st.integers(1, 64), st.integers(0, 900))
def test_targets_are_the_scheduled_shares_of_the_steps_summed(schedule: Schedule, batch: int,
                                                              steps: int) -> None:
    total = np.zeros(schedule.components)
    for k in range(steps):
        total += shares_by_definition(schedule, k)
    got = schedule.targets([steps], batch)[0]
    assert np.allclose(got, total * batch, rtol=1e-9, atol=1e-6 * max(1, steps * batch))
    assert np.allclose(schedule.shares_at(np.arange(min(steps, 50))),
                       [shares_by_definition(schedule, k) for k in range(min(steps, 50))]
                       or np.zeros((0, schedule.components)))


@given(schedules(), st.integers(1, 64), st.integers(1, 700))
def test_counts_follow_the_schedule_and_never_go_back(schedule: Schedule, batch: int,
                                                      steps: int) -> None:
    a = cumulative_counts(schedule, batch, 0, steps,
                          np.zeros(schedule.components, dtype=np.int64))
    t = schedule.targets(np.arange(steps + 1), batch)
    per_step = np.diff(a, axis=0)
    assert (per_step >= 0).all()
    assert (per_step.sum(axis=1) == batch).all()
    # Within two samples of the scheduled total at every step boundary, so any run of steps
    # has its scheduled share to within four samples per component.
    assert np.abs(a - t).max() < 2
    # Off means off: a step gives nothing to a component whose share there is 0.
    off = schedule.shares_at(np.arange(steps)) == 0
    assert not per_step[off].any()


@given(schedules(), st.integers(1, 16), st.integers(2, 400), st.data())
def test_counts_continue_from_any_step(schedule: Schedule, batch: int, steps: int,
                                       data: st.DataObject) -> None:
    """What a resume (or the next epoch) computes from a step in the middle is what the whole
    run computed."""
    whole = cumulative_counts(schedule, batch, 0, steps,
                              np.zeros(schedule.components, dtype=np.int64))
    cut = data.draw(st.integers(1, steps - 1))
    rest = cumulative_counts(schedule, batch, cut, steps, whole[cut])
    assert (rest == whole[cut:]).all()


@given(st.lists(st.floats(-50, 50), min_size=1, max_size=6), st.integers(1, 200))
def test_catch_up_gives_to_the_most_owed(owed: list[float], total: int) -> None:
    give = catch_up(np.asarray(owed), total)
    assert give.sum() == total and (give >= 0).all()
    left = np.asarray(owed) - give
    # Nobody is given a sample while someone it was given ahead of is owed a sample more.
    for i, g in enumerate(give):
        if g:
            assert left[i] > left.max() - 2 + 1e-9


@given(schedules(), st.integers(1, 12), st.integers(1, 3), st.integers(1, 120), st.data())
def test_lanes_are_dealt_the_same_whoever_asks(schedule: Schedule, lanes: int, per_lane: int,
                                                steps: int, data: st.DataObject) -> None:
    """Any range of lanes (a rank's, a worker's) and any range of steps (an epoch, a resume)
    is the same part of the one deal: the same global batches on any world size."""
    batch = lanes * per_lane
    whole = LaneDeal(schedule, batch, lanes, seed=7).slots(0, steps, 0, lanes)
    lo = data.draw(st.integers(0, lanes - 1))
    hi = data.draw(st.integers(lo + 1, lanes))
    cut = data.draw(st.integers(0, steps))
    part = LaneDeal(schedule, batch, lanes, seed=7)
    first, second = part.slots(0, cut, lo, hi), part.slots(cut, steps, lo, hi)
    cols = cut * per_lane
    assert (first.component == whole.component[lo:hi, :cols]).all()
    assert (second.component == whole.component[lo:hi, cols:]).all()
    assert (second.position == whole.position[lo:hi, cols:]).all()
    fresh = LaneDeal(schedule, batch, lanes, seed=7).slots(cut, steps, lo, hi)  # no carry
    assert (fresh.position == second.position).all()


@given(schedules(), st.integers(1, 12), st.integers(1, 3), st.integers(1, 120))
def test_every_lane_gets_its_columns_and_the_steps_their_counts(
        schedule: Schedule, lanes: int, per_lane: int, steps: int) -> None:
    batch = lanes * per_lane
    deal = LaneDeal(schedule, batch, lanes, seed=3)
    slots = deal.slots(0, steps, 0, lanes)
    counts = deal.counts(0, steps)
    by_step = slots.component.reshape(lanes, steps, per_lane)
    for i in range(schedule.components):
        assert ((by_step == i).sum(axis=(0, 2)) == counts[:, i]).all()
        # A lane reads component i's stream in order, from its start, without gaps.
        for j in range(lanes):
            mine = slots.position[j][slots.component[j] == i]
            assert (mine == np.arange(len(mine))).all()


@given(st.integers(1, 16), st.integers(1, 3), st.integers(1, 6), st.data())
def test_constant_counts_reach_every_lane_equally(lanes: int, per_lane: int, blocks: int,
                                                  data: st.DataObject) -> None:
    """Counts that are the same at every step: after every ``lanes`` steps each lane has had
    exactly its share of each component (the deal's start visits every lane once)."""
    batch = lanes * per_lane
    n = data.draw(st.integers(1, 4))
    cuts = sorted(data.draw(st.lists(st.integers(0, batch), min_size=n - 1, max_size=n - 1)))
    counts = np.diff([0, *cuts, batch])
    if not counts.any():
        return
    schedule = Schedule.of([(0, counts.tolist()), (10**6, counts.tolist())], "step")
    deal = LaneDeal(schedule, batch, lanes, seed=data.draw(st.integers(0, 99)))
    slots = deal.slots(0, blocks * lanes, 0, lanes)
    for i, c in enumerate(counts):
        assert ((slots.component == i).sum(axis=1) == blocks * c).all()


def test_counts_that_follow_a_pattern_do_not_pile_onto_one_lane() -> None:
    """Two lanes, shares 3/4 and 1/4 of a batch of 2: component 0 gets 1, 2, 1, 2, ... samples,
    the step's second slot goes to component 1 every other step. A plain rotation of the start
    (0, 1, 0, 1) would put all of component 1 on one lane; the shift per two steps spreads it."""
    schedule = Schedule.of([(0, [3, 1]), (10**6, [3, 1])], "step")
    slots = LaneDeal(schedule, 2, 2, seed=0).slots(0, 4000, 0, 2)
    ones = (slots.component == 1).sum(axis=1)
    assert ones.sum() == 2000
    assert abs(int(ones[0]) - int(ones[1])) < 0.25 * ones.sum() / 2, ones


def test_rotation_multiplier_is_coprime_and_near_the_golden_ratio() -> None:
    assert rotation_multiplier(1) == 0
    for lanes in (2, 3, 8, 12, 64, 100, 256, 1000):
        g = rotation_multiplier(lanes)
        assert math.gcd(g, lanes) == 1 and abs(g - 0.618 * lanes) <= max(2, lanes * 0.05)


@given(schedules(), st.integers(0, 500), st.integers(1, 500))
def test_scheduled_shares_of_a_run_of_steps(schedule: Schedule, first: int, length: int
                                            ) -> None:
    total = np.zeros(schedule.components)
    for k in range(first, first + length):
        total += shares_by_definition(schedule, k)
    assert np.allclose(scheduled_shares(schedule, first, first + length), total / length,
                       atol=1e-9)


@pytest.mark.parametrize(("points", "ramp", "message"), [
    ([], "linear", "one or more points"),
    ([(5, [1, 1])], "linear", "the first point must be at step 0"),
    ([(0, [1, 1]), (10, [1, 2]), (10, [2, 1])], "linear", r"point 2: step 10 does not come "
                                                           r"after step 10"),
    ([(0, [1, 1]), (-3, [1, 1])], "linear", "point 1: step -3 is not an integer"),
    ([(0, [1, -1])], "linear", r"point 0: weight -1\.0 is not finite and >= 0"),
    ([(0, [1, float("nan")])], "linear", "weight nan is not finite"),
    ([(0, [1, float("inf")])], "linear", "weight inf is not finite"),
    ([(0, [1, 1]), (4, [0, 0])], "linear", "point 1: every weight is 0"),
    ([(0, [1, 1]), (4, [1, 1, 1])], "linear", "point 1: 3 weights, point 0 has 2"),
    ([(0, [1e308, 1e308])], "linear", "overflows"),
    ([(0, [1, 1])], "cubic", "ramp is 'cubic'"),
    ([(0.5, [1, 1])], "linear", "step 0.5 is not an integer"),
])
def test_bad_schedules_are_refused_by_point(points: list, ramp: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Schedule.of(points, ramp)  # type: ignore[arg-type]


def test_lanes_must_divide_the_step() -> None:
    with pytest.raises(ValueError, match="lanes do not divide"):
        LaneDeal(Schedule.of([(0, [1, 1]), (5, [1, 2])]), 12, 8, seed=0)
