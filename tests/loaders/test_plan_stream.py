"""The streamed plan (LanePlan columns, RankStream chunks) against the materialised one:
the same samples in the same order, bit for bit, for any layout and resume point."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import plan
from loaders.plan import LanePlan, Layout, PlanParams, Progress, RankStream

size_lists = st.lists(st.integers(0, 40), min_size=0, max_size=40)  # zeros: empty blocks
seeds = st.integers(0, 2**32 - 1)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@settings(max_examples=300, deadline=None)
@given(size_lists, seeds, st.integers(0, 5), st.integers(1, 12), st.integers(1, 6),
       st.booleans(), st.integers(1, 4), st.data())
def test_columns_are_the_materialised_lanes(sizes, seed, epoch, lanes, window, shuffle, run,
                                            data) -> None:
    params = PlanParams(seed, shuffle, window, run)
    arr = np.array(sizes, dtype=np.int64)
    lo = data.draw(st.integers(0, lanes))
    hi = data.draw(st.integers(lo, lanes))
    whole = plan.lane_samples(arr, params, epoch, lanes, lo, hi)
    lanes_ = LanePlan(arr, params, epoch, lanes, lo, hi)
    m = whole.shape[1]
    assert lanes_.m == m
    c0 = data.draw(st.integers(0, m))
    c1 = data.draw(st.integers(c0, m + 2))
    got = lanes_.columns(c0, c1)
    assert got.dtype == np.int64
    assert np.array_equal(got, whole[:, c0:c1])
    # Any cut into pieces gives the same lanes.
    step = data.draw(st.integers(1, max(1, m)))
    pieces = [lanes_.columns(c, c + step) for c in range(0, m, step)]
    joined = np.concatenate(pieces, axis=1) if pieces else whole[:, :0]
    assert np.array_equal(joined, whole)


@settings(max_examples=300, deadline=None)
@given(size_lists, seeds, st.sampled_from([1, 2, 3, 4, 6, 8, 12]), st.integers(1, 3),
       st.integers(1, 6), st.booleans(), st.integers(1, 40), st.integers(1, 4), st.data())
def test_rank_stream_is_the_sequence(sizes, seed, lanes, per_lane, window, shuffle, chunk,
                                     run, data) -> None:
    """Every world size, rank, batch size, chunk size and resume point (at a step boundary
    or mid-step on the same layout): the stream's chunks concatenate to ``sequence``."""
    params = PlanParams(seed, shuffle, window, run)
    arr = np.array(sizes, dtype=np.int64)
    world = data.draw(st.sampled_from(_divisors(lanes)))
    rank = data.draw(st.integers(0, world - 1))
    step = lanes // world * per_lane
    batch = data.draw(st.sampled_from(_divisors(step)))
    layout = Layout(lanes, per_lane, world, rank, batch)
    lo, hi = layout.rank_lanes()
    epoch = data.draw(st.integers(0, 3))
    block = plan.lane_samples(arr, params, epoch, lanes, lo, hi)
    m = block.shape[1]
    full = plan.sequence(block, layout, Progress(epoch))
    done = data.draw(st.integers(0, len(full)))
    progress = plan.advance(Progress(epoch), layout, m, done)
    if data.draw(st.booleans()):  # a state saved on another layout, at a step boundary
        progress = Progress(epoch, lane_pos=data.draw(st.integers(0, m + 1)))
    want = plan.sequence(block, layout, progress)
    stream = RankStream(LanePlan(arr, params, epoch, lanes, lo, hi).columns, m, layout,
                        progress, chunk_samples=chunk)
    parts = list(stream.chunks())
    assert all(len(p) for p in parts)
    got = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    assert got.dtype == np.int64
    assert got.tolist() == want.tolist()
    assert len(stream) == len(want)
    assert [b.tolist() for b in stream.batches()] == [
        b.tolist() for b in plan.batches_of(want, layout.batch)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=30), st.integers(1, 7), st.integers(1, 5))
def test_rebatch_cuts_like_batches_of(lengths, batch, seed) -> None:
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    seq = rng.integers(0, 1000, total)
    edges = np.cumsum([0, *lengths])
    parts = [seq[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True)]
    got = [b.tolist() for b in plan.rebatch(iter(parts), batch)]
    assert got == [b.tolist() for b in plan.batches_of(seq, batch)]


def test_a_resume_does_not_generate_the_earlier_columns() -> None:
    arr = np.full(200, 50, dtype=np.int64)
    layout = Layout(4, 2, 2, 1)
    lo, hi = layout.rank_lanes()
    lanes = LanePlan(arr, PlanParams(3), 0, 4, lo, hi)
    asked: list[tuple[int, int]] = []

    def columns(c0: int, c1: int) -> np.ndarray:
        asked.append((c0, c1))
        return lanes.columns(c0, c1)

    progress = Progress(0, lane_pos=2000)
    stream = RankStream(columns, lanes.m, layout, progress, chunk_samples=64)
    first = next(iter(stream.chunks()))
    assert asked == [(2000, 2032)]
    block = plan.lane_samples(arr, PlanParams(3), 0, 4, lo, hi)
    assert first.tolist() == plan.sequence(block, layout, progress)[:len(first)].tolist()


class _Materialised:
    """A source whose lanes are drawn whole (as a mixture's): streamed from them."""

    def __init__(self, group: object) -> None:
        self.group = group

    def lane_length(self, lanes: int) -> int:
        return self.group.lane_length(lanes)  # type: ignore[attr-defined]

    def lane_samples(self, epoch: int, lanes: int, lo: int, hi: int) -> np.ndarray:
        return self.group.lane_samples(epoch, lanes, lo, hi)  # type: ignore[attr-defined]

    def lane_plan(self, epoch: int, lanes: int, lo: int, hi: int) -> plan.WholeLanes:
        return plan.WholeLanes(self.lane_samples(epoch, lanes, lo, hi))


def test_rank_stream_of_a_source_by_column_and_drawn_whole() -> None:
    from loaders.settings import LoaderSettings
    from loaders.source import GroupPlan, rank_stream

    rng = np.random.default_rng(0)
    group = GroupPlan(rng.integers(0, 3000, 300), LoaderSettings(63))
    layout = Layout(8, 3, 4, 3, 2)
    lo, hi = layout.rank_lanes()
    for progress in (Progress(1), Progress(1, lane_pos=7)):
        want = plan.sequence(group.lane_samples(1, 8, lo, hi), layout, progress).tolist()
        for source in (group, _Materialised(group)):
            stream = rank_stream(source, layout, progress, chunk_samples=50)  # type: ignore[arg-type]
            assert stream.materialise().tolist() == want


def _grouped_batches(chunks: list[np.ndarray], batch: int, at_least: int
                     ) -> list[tuple[list[int], list[int]]]:
    """What the loader did before :func:`plan.batch_pieces`: cut the stream into batches
    (:func:`plan.rebatch`), then join them into pieces of at least ``at_least`` samples."""
    out, held, count = [], [], 0
    for b in plan.rebatch(iter(chunks), batch):
        held.append(b)
        count += len(b)
        if count >= at_least:
            out.append((np.concatenate(held).tolist(), [len(x) for x in held]))
            held, count = [], 0
    if held:
        out.append((np.concatenate(held).tolist(), [len(x) for x in held]))
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=12), st.integers(1, 9), st.integers(0, 60))
def test_batch_pieces_are_the_grouped_batches(chunk_sizes, batch, at_least) -> None:
    """The loader's pieces come straight from the plan's chunks: the same samples, the same
    piece boundaries and batch sizes as cutting batches one at a time and joining them."""
    bounds = np.cumsum([0, *chunk_sizes])
    stream = np.arange(bounds[-1], dtype=np.int64) * 7 + 3
    chunks = [stream[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    got = [(s.tolist(), sizes) for s, sizes in plan.batch_pieces(iter(chunks), batch,
                                                                 at_least)]
    assert got == _grouped_batches(chunks, batch, at_least)
