"""Property tests of the request plan: every row group once, one shard per unit, the window and
byte bounds kept, units in order of first use."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from loaders.coalesce import plan_units


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
