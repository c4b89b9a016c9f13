"""Property tests of the pure sample plan."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import plan

sizes = st.integers(min_value=0, max_value=3000)
blocks = st.integers(min_value=1, max_value=64)
worlds = st.integers(min_value=1, max_value=8)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@given(sizes, blocks, seeds, st.integers(0, 100), st.booleans())
def test_epoch_order_is_a_permutation_and_deterministic(n, block, seed, epoch, shuffle) -> None:
    order = plan.epoch_order(n, block, seed, epoch, shuffle)
    assert sorted(order.tolist()) == list(range(n))
    assert np.array_equal(order, plan.epoch_order(n, block, seed, epoch, shuffle))


@given(st.integers(200, 3000), blocks, seeds, st.integers(0, 100))
def test_each_epoch_has_a_new_order(n, block, seed, epoch) -> None:
    a = plan.epoch_order(n, block, seed, epoch)
    b = plan.epoch_order(n, block, seed, epoch + 1)
    assert not np.array_equal(a, b)


@settings(max_examples=200)
@given(sizes, blocks, seeds, worlds, st.integers(0, 4), st.integers(1, 16))
def test_ranks_and_workers_cover_every_sample_once_apart_from_padding(
        n, block, seed, world, workers, batch) -> None:
    order = plan.epoch_order(n, block, seed, 0)
    per_rank = plan.samples_per_rank(n, world)
    pad = per_rank * world - n
    assert 0 <= pad < world
    seen: list[int] = []
    for rank in range(world):
        mine = plan.rank_slice(order, rank, world)
        assert len(mine) == per_rank  # equal counts: no DDP hang at the end of an epoch
        from_workers = [plan.worker_slice(mine, w, workers, batch) for w in range(max(workers, 1))]
        assert sorted(np.concatenate(from_workers).tolist()) == sorted(mine.tolist())
        seen += mine.tolist()
    counts = np.bincount(np.array(seen, dtype=np.int64), minlength=n) if n else np.array([])
    assert (counts >= 1).all()
    assert int((counts - 1).sum()) == pad  # only the documented padding repeats


@given(sizes, blocks, worlds, st.integers(1, 4), st.integers(1, 16))
def test_worker_batches_interleave_back_into_rank_order(n, block, world, workers, batch) -> None:
    """The DataLoader collects batch k from worker k % W: that must rebuild the rank's order."""
    mine = plan.rank_slice(plan.epoch_order(n, block, 7, 3), world - 1, world)
    per_worker = [list(plan.worker_slice(mine, w, workers, batch)) for w in range(workers)]
    rebuilt: list[int] = []
    k = 0
    while any(per_worker):
        chunk = per_worker[k % workers][:batch]
        del per_worker[k % workers][:batch]
        rebuilt += chunk
        k += 1
    assert rebuilt == mine.tolist()


def test_ranks_read_mostly_disjoint_blocks() -> None:
    n, block, world = 10_000, 50, 4
    order = plan.epoch_order(n, block, seed=1, epoch=0)
    owners = [set((plan.rank_slice(order, r, world) // block).tolist()) for r in range(world)]
    shared = sum(len(owners[a] & owners[b]) for a in range(world) for b in range(a + 1, world))
    # Only the shuffle windows (4 blocks) cut by one of the world - 1 rank boundaries are shared.
    assert shared <= (world - 1) * 4 < n // block // 10


def test_samples_stay_inside_row_groups() -> None:
    tokens = np.array([10, 4, 11])  # with seq_len 4: 2, 0 and 2 samples
    counts = plan.group_samples(tokens, 4)
    assert counts.tolist() == [2, 0, 2]
    starts = plan.sample_starts(np.arange(4), counts, np.array([0, 10, 14]), 4)
    assert starts.tolist() == [0, 5, 14, 19]  # tokens 10..13 and 24 are not used


@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), seeds, st.integers(0, 50),
       st.integers(1, 8))
def test_block_order_permutes_and_keeps_blocks_together(sizes, seed, epoch, window) -> None:
    order = plan.block_order(np.array(sizes), seed, epoch, True, window)
    n = sum(sizes)
    assert sorted(order.tolist()) == list(range(n))
    block_of = np.repeat(np.arange(len(sizes)), sizes)
    # A reader holds a row group from its block's first sample to its last: at no point may
    # more than `window` blocks be partly consumed.
    left = list(sizes)
    open_blocks: set[int] = set()
    most = 0
    for blk in block_of[order].tolist():
        left[blk] -= 1
        open_blocks.add(blk)
        most = max(most, len(open_blocks))
        if left[blk] == 0:
            open_blocks.discard(blk)
    assert most <= window


@settings(max_examples=150)
@given(st.integers(1, 800), blocks, seeds, worlds, st.integers(1, 8), worlds, st.integers(1, 8),
       st.data())
def test_elastic_resume_consumes_every_sample_once(n, block, seed, w1, b1, w2, b2, data) -> None:
    """Stop after some steps on w1 ranks, resume on w2 ranks: each sample once, bar padding."""
    order = plan.epoch_order(n, block, seed, 2)
    per_rank1 = plan.samples_per_rank(n, w1)
    steps1 = data.draw(st.integers(0, -(-per_rank1 // b1)))
    consumed: list[int] = []
    for r in range(w1):
        consumed += plan.rank_sequence(order, [], r, w1, b1)[:steps1 * b1].tolist()
    segments = [(w1, b1, steps1)]
    for r in range(w2):
        consumed += plan.rank_sequence(order, segments, r, w2, b2).tolist()
    counts = np.bincount(np.array(consumed, dtype=np.int64), minlength=n)
    assert (counts >= 1).all()
    assert int((counts - 1).sum()) < w1 + w2  # only the two splits' padding repeats


@given(st.integers(1, 500), blocks, worlds, st.integers(1, 8), st.data())
def test_resume_on_same_world_continues_the_same_sequence(n, block, world, batch, data) -> None:
    order = plan.epoch_order(n, block, 5, 0)
    rank = data.draw(st.integers(0, world - 1))
    full = plan.rank_sequence(order, [], rank, world, batch)
    steps = data.draw(st.integers(0, -(-len(full) // batch)))
    resumed = plan.rank_sequence(order, [(world, batch, steps)], rank, world, batch)
    assert resumed.tolist() == full[steps * batch:].tolist()
