"""Property tests of the request plan: every row group once, one shard per unit, the window and
byte bounds kept, units in order of first use."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from loaders.coalesce import (
    GROWTH_SAMPLES,
    GROWTH_TOLERANCE,
    AdaptiveWindow,
    UnitPlanner,
    _median,
    plan_units,
    run_per_lane_bytes,
    window_cap,
)


@st.composite
def layouts(draw):  # type: ignore[no-untyped-def]
    shards = draw(st.integers(1, 6))
    per = [draw(st.integers(1, 12)) for _ in range(shards)]
    shard_of = np.repeat(np.arange(shards), per)
    lengths = np.array([draw(st.integers(1, 1000)) for _ in range(len(shard_of))])
    offset = np.zeros(len(shard_of), dtype=np.int64)
    for s in range(shards):
        idx = np.flatnonzero(shard_of == s)
        offset[idx] = np.concatenate([[4], 4 + np.cumsum(lengths[idx])[:-1]])
    n = len(shard_of)
    order = draw(st.permutations(list(range(n))))
    window = draw(st.integers(0, n + 2))
    max_bytes = draw(st.integers(1, 6000))
    return list(order), shard_of, offset, lengths, window, max_bytes


@given(layouts())
def test_units_partition_the_order_within_bounds(case) -> None:  # type: ignore[no-untyped-def]
    order, shard_of, offset, length, window, max_bytes = case
    units = plan_units(order, shard_of, offset, length, window, max_bytes)
    flat = [g for u in units for g in u]
    assert sorted(flat) == sorted(order) and len(flat) == len(order)
    pos = {g: i for i, g in enumerate(order)}
    heads = [pos[u[0]] for u in units]
    assert heads == sorted(heads)  # units in order of first use
    for u in units:
        assert len({int(shard_of[g]) for g in u}) == 1
        assert [pos[g] for g in u] == sorted(pos[g] for g in u)
        assert all(pos[g] - pos[u[0]] <= window for g in u)
        span = max(int(offset[g] + length[g]) for g in u) - min(int(offset[g]) for g in u)
        assert len(u) == 1 or span <= max_bytes
        # the head is the earliest-used group not taken by an earlier unit
    taken: set[int] = set()
    for u in units:
        first_free = next(g for g in order if g not in taken)
        assert u[0] == first_free
        taken.update(u)


def test_window_zero_is_one_unit_per_group() -> None:
    shard_of = np.array([0, 0, 0, 1])
    offset, length = np.array([4, 14, 24, 4]), np.array([10, 10, 10, 10])
    assert plan_units([2, 0, 3, 1], shard_of, offset, length, 0, 1 << 20) == [[2], [0], [3], [1]]


def test_neighbours_used_soon_share_a_request() -> None:
    shard_of = np.array([0, 0, 0, 1, 1])
    offset, length = np.array([4, 14, 24, 4, 14]), np.array([10, 10, 10, 10, 10])
    order = [0, 3, 2, 4, 1]
    assert plan_units(order, shard_of, offset, length, 2, 1 << 20) == [[0, 2], [3, 4], [1]]
    assert plan_units(order, shard_of, offset, length, 4, 1 << 20) == [[0, 2, 1], [3, 4]]
    assert plan_units(order, shard_of, offset, length, 4, 20) == [[0, 1], [3, 4], [2]]


# -- units planned one at a time, at a window that changes between them -----------------------


@given(layouts(), st.lists(st.integers(0, 40), min_size=1, max_size=60))
def test_planner_with_changing_windows_partitions_the_order(case, windows) -> None:  # type: ignore[no-untyped-def]
    order, shard_of, offset, length, _window, max_bytes = case
    planner = UnitPlanner(order, shard_of, offset, length)
    pos = {g: i for i, g in enumerate(order)}
    units = []
    for p in range(len(order)):
        w = windows[p % len(windows)]
        unit = planner.unit_at(p, w, max_bytes)
        if unit is None:
            continue
        assert unit[0] == order[p]  # headed by the position asked for
        assert all(0 <= pos[g] - p <= w for g in unit)  # within the window of its time
        span = max(int(offset[g] + length[g]) for g in unit) - min(int(offset[g]) for g in unit)
        assert len(unit) == 1 or span <= max_bytes
        assert len({int(shard_of[g]) for g in unit}) == 1
        units.append(unit)
    flat = [g for u in units for g in u]
    assert sorted(flat) == sorted(order) and len(flat) == len(order)  # each group exactly once


def test_fixed_window_planner_is_plan_units() -> None:
    rng = np.random.default_rng(0)
    shard_of = np.repeat(np.arange(5), 16)
    length = rng.integers(100, 300, len(shard_of))
    offset = np.concatenate([np.cumsum(length[s * 16:(s + 1) * 16]) - length[s * 16:(s + 1) * 16]
                             for s in range(5)])
    order = rng.permutation(len(shard_of)).tolist()
    planner = UnitPlanner(order, shard_of, offset, length)
    got = [u for p in range(len(order)) if (u := planner.unit_at(p, 12, 2000)) is not None]
    assert got == plan_units(order, shard_of, offset, length, 12, 2000)


# -- the growth rule ----------------------------------------------------------------------------


@given(st.integers(1, 64), st.integers(0, 5000), st.integers(1, 1 << 20),
       st.lists(st.tuples(st.integers(0, 12), st.integers(0, 1 << 22),
                          st.floats(0, 10, allow_nan=False)), max_size=80))
def test_window_grows_only_as_the_rule_says(start, cap, max_bytes, observations) -> None:  # type: ignore[no-untyped-def]
    w = AdaptiveWindow(start, cap, max_bytes, 64 * max_bytes)
    assert w.window == w.start == max(1, start)
    for level, nbytes, seconds in observations:
        before, frozen = w.window, w.frozen
        w.observe(min(level, w.level + 1), nbytes, seconds)
        assert w.start <= w.window <= max(w.start, cap)  # never beyond the memory budget
        assert w.max_bytes <= 64 * max_bytes
        if frozen:
            assert w.window == before  # stopped growing: stays
        elif w.window != before:  # one doubling up (capped) or one step back, then frozen
            assert w.window == min(w.cap, 2 * before) or (w.window < before and w.frozen)
    for a, b in zip(w.history, w.history[1:], strict=False):
        assert b == min(w.cap, 2 * a) or b < a


def test_window_doubles_while_time_per_byte_stays_flat_and_stops_when_it_rises() -> None:
    w = AdaptiveWindow(8, 100, 1 << 20, 1 << 30)
    for level, size in ((0, 1000), (1, 2000), (2, 4000)):
        for _ in range(GROWTH_SAMPLES):
            w.observe(level, size, size * 1e-6)  # flat: 1 us per byte at every size
    assert w.history == [8, 16, 32, 64] and not w.frozen
    for _ in range(GROWTH_SAMPLES):
        w.observe(3, 8000, 8000 * 1e-6 * GROWTH_TOLERANCE * 2)  # larger requests: slower
    assert w.window == 32 and w.frozen  # back to the last size that kept up
    w.observe(2, 4000, 1e-9)
    assert w.window == 32
    capped = AdaptiveWindow(8, 20, 1 << 20, 1 << 30)
    for level in range(4):
        for _ in range(GROWTH_SAMPLES):
            capped.observe(level, 1000, 1e-3)
    assert capped.history == [8, 16, 20] and capped.frozen  # the budget's window, no more


@given(st.lists(st.floats(1e-12, 1e-3), min_size=1, max_size=9))
def test_the_window_judges_by_the_median_numpy_gives(values: list[float]) -> None:
    assert _median(values) == float(np.median(values))


@given(st.integers(1, 64), st.integers(1, 128), st.integers(1, 64), st.integers(1, 1 << 22),
       st.integers(1, 512))
def test_a_run_per_lane_budget_is_the_least_whose_window_covers_the_runs(
        lanes, run, lookahead, group_bytes, start) -> None:
    """``run_per_lane_bytes`` is the budget at which ``window_cap`` first reaches a run of
    every lane: what the loader's warning asks for is enough, and not more than needed."""
    need = run_per_lane_bytes(lanes, run, lookahead, group_bytes)
    assert window_cap(need, group_bytes, lookahead, start) >= lanes * run
    if start < lanes * run:
        assert window_cap(need - 1, group_bytes, lookahead, start) < lanes * run
