"""Property tests of the pure per-rank plan against a brute-force global order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import plan
from loaders.permute import Feistel, hash32
from loaders.plan import Layout, PlanParams, Progress

size_lists = st.lists(st.integers(0, 40), min_size=0, max_size=40)
seeds = st.integers(0, 2**32 - 1)
windows = st.integers(1, 6)
runs = st.integers(1, 4)  # run_blocks: 1 = every block on its own


def reference(sizes: list[int], params: PlanParams, epoch: int, lanes: int) -> np.ndarray:
    """The whole epoch, built the obvious way (global order first): ``[lanes, m]``."""
    g_count = len(sizes)
    first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    run = params.resolved(g_count, lanes).run_blocks  # auto: 1 at these sizes
    if params.shuffle and g_count:
        # runs of `run` consecutive blocks permuted as one; the last run's missing members
        # are empty slots (they still count in the windows, as empty blocks do)
        n_runs = -(-g_count // run)
        order = Feistel(n_runs, (plan._BLOCK_DOMAIN, params.seed, epoch))(np.arange(n_runs))
        perm = np.array([r * run + k for r in order.tolist() for k in range(run)])
    else:
        perm = np.arange(g_count)
    padded = list(sizes) + [0] * (len(perm) - g_count)
    sample_at, window_at, block_starts = [], [], set()
    for i, g in enumerate(perm.tolist()):
        block_starts.add(len(sample_at))
        for k in range(padded[g]):
            sample_at.append(int(first[g]) + k)
            window_at.append(i // params.window_blocks)
    n = len(sample_at)
    m = -(-n // lanes)
    out = np.zeros((lanes, m), dtype=np.int64)
    for j in range(lanes):
        a, b = j * n // lanes, (j + 1) * n // lanes
        positions = list(range(a, b))
        if params.shuffle:
            key = hash32(np.array(positions, dtype=np.int64),
                         (plan._SHUFFLE_DOMAIN, params.seed, epoch)).tolist()
            # shuffle inside each run of one window within the lane
            positions = sorted(positions, key=lambda q: (window_at[q], key[q - a], q))
            if positions and a not in block_starts:  # starts inside a block: first run last
                first = sum(1 for q in positions if window_at[q] == window_at[a])
                positions = positions[first:] + positions[:first]
        lane = [sample_at[q] for q in positions]
        real = len(lane)
        for t in range(real, m):
            lane.append(lane[real - 1 - (t - real) % real] if real else (j * m + t) % n)
        out[j] = lane
    return out


@settings(max_examples=300)
@given(size_lists, seeds, st.integers(0, 20), st.integers(1, 12), windows, st.booleans(),
       runs, st.data())
def test_any_lane_range_matches_the_brute_force_order(sizes, seed, epoch, lanes, window,
                                                      shuffle, run, data) -> None:
    params = PlanParams(seed, shuffle, window, run)
    ref = reference(sizes, params, epoch, lanes)
    lo = data.draw(st.integers(0, lanes))
    hi = data.draw(st.integers(lo, lanes))
    got = plan.lane_samples(np.array(sizes, dtype=np.int64), params, epoch, lanes, lo, hi)
    assert got.tolist() == ref[lo:hi].tolist()


def test_windows_that_start_at_an_empty_block_still_cut() -> None:
    sizes = [3, 3, 0, 3, 3, 0, 0, 4, 0, 5]
    for seed in range(40):
        for window in (1, 2, 3):
            params = PlanParams(seed, True, window)
            got = plan.lane_samples(np.array(sizes), params, 1, 2, 0, 2)
            assert got.tolist() == reference(sizes, params, 1, 2).tolist()


@settings(max_examples=200)
@given(size_lists, seeds, st.integers(1, 16), windows, runs)
def test_every_sample_once_per_epoch_bar_fewer_than_lanes_repeats(sizes, seed, lanes,
                                                                  window, run) -> None:
    arr = np.array(sizes, dtype=np.int64)
    whole = plan.lane_samples(arr, PlanParams(seed, True, window, run), 3, lanes, 0, lanes)
    n = int(arr.sum())
    if n == 0:
        assert whole.size == 0
        return
    counts = np.bincount(whole.reshape(-1), minlength=n)
    assert (counts >= 1).all()
    assert 0 <= int(counts.sum()) - n < lanes
    if n >= lanes:  # at most one repeat per lane
        assert all(len(set(row)) >= len(row) - 1 for row in whole.tolist())


@given(st.lists(st.integers(1, 40), min_size=5, max_size=40), seeds, st.integers(0, 50))
def test_each_epoch_has_a_new_order(sizes, seed, epoch) -> None:
    arr = np.array(sizes)
    a = plan.lane_samples(arr, PlanParams(seed), epoch, 2, 0, 2)
    b = plan.lane_samples(arr, PlanParams(seed), epoch + 1, 2, 0, 2)
    assert not np.array_equal(a, b)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _global_batches(sizes, params, lanes, per_lane, world, workers=1, epoch=0):
    """Global batches as the ranks (and their workers) produce them."""
    arr = np.array(sizes, dtype=np.int64)
    n = int(arr.sum())
    m = plan.lane_length(n, lanes)
    per_rank = []
    for r in range(world):
        layout = Layout(lanes, per_lane, world, r)
        lo, hi = layout.rank_lanes()
        block = plan.lane_samples(arr, params, 0, lanes, lo, hi)
        seq = plan.sequence(block, layout, Progress())
        if workers > 1:  # rebuild the rank's batches from its workers' parts
            parts = [plan.worker_parts(hi - lo, m, layout, Progress(), w, workers)
                     for w in range(workers)]
            rebuilt, cursor = [], [0] * workers
            for k in range(plan.rank_batches(m, layout, Progress())):
                for w, (pos, counts) in enumerate(parts):
                    take = pos[cursor[w]:cursor[w] + counts[k]]
                    cursor[w] += counts[k]
                    rebuilt += seq[take].tolist()
            assert rebuilt == seq.tolist()
        per_rank.append(list(plan.batches_of(seq, layout.batch)))
    assert len({len(b) for b in per_rank}) == 1  # equal batch counts: no DDP hang
    return [sorted(x for r in range(world) for x in per_rank[r][k].tolist())
            for k in range(len(per_rank[0]))]


@settings(max_examples=150)
@given(size_lists, seeds, st.sampled_from([1, 2, 4, 6, 8, 12]), st.integers(1, 3), windows,
       runs, st.data())
def test_global_batches_do_not_depend_on_world_size_or_workers(sizes, seed, lanes, per_lane,
                                                               window, run, data) -> None:
    params = PlanParams(seed, True, window, run)
    ref = _global_batches(sizes, params, lanes, per_lane, 1)
    world = data.draw(st.sampled_from(_divisors(lanes)))
    workers = data.draw(st.integers(1, lanes // world))
    assert _global_batches(sizes, params, lanes, per_lane, world, workers) == ref


@settings(max_examples=150)
@given(size_lists, seeds, st.sampled_from([2, 4, 6, 12]), st.integers(1, 3), st.data())
def test_elastic_resume_continues_the_same_global_batches(sizes, seed, lanes, per_lane,
                                                          data) -> None:
    """Stop after k global batches on W1 ranks (each with accumulation), resume on W2."""
    arr = np.array(sizes, dtype=np.int64)
    params = PlanParams(seed, True, 2)
    n = int(arr.sum())
    m = plan.lane_length(n, lanes)
    ref = _global_batches(sizes, params, lanes, per_lane, 1)
    w1 = data.draw(st.sampled_from(_divisors(lanes)))
    w2 = data.draw(st.sampled_from(_divisors(lanes)))
    k = data.draw(st.integers(0, len(ref)))
    # Every rank of the first job consumed k global batches, in micro-batches.
    step1 = Layout(lanes, per_lane, w1, 0).step
    micro = data.draw(st.sampled_from(_divisors(step1)))
    progress = Progress()
    layout1 = Layout(lanes, per_lane, w1, 0, micro)
    consumed = sum(min(per_lane, m - i * per_lane) for i in range(k)) * (lanes // w1)
    progress = plan.advance(progress, layout1, m, consumed)
    assert progress.into_step == 0
    assert progress.lane_pos == min(m, k * per_lane)
    rest = []
    for r in range(w2):
        layout = Layout(lanes, per_lane, w2, r)
        lo, hi = layout.rank_lanes()
        seq = plan.sequence(plan.lane_samples(arr, params, 0, lanes, lo, hi), layout, progress)
        rest.append(list(plan.batches_of(seq, layout.batch)))
    resumed = [sorted(x for r in range(w2) for x in rest[r][i].tolist())
               for i in range(len(rest[0]))]
    assert resumed == ref[k:]


@given(st.lists(st.integers(0, 30), max_size=30), st.sampled_from([2, 4]), st.integers(1, 3),
       st.data())
def test_resume_mid_step_on_the_same_layout_continues_exactly(sizes, lanes, per_lane,
                                                              data) -> None:
    arr = np.array(sizes, dtype=np.int64)
    n = int(arr.sum())
    m = plan.lane_length(n, lanes)
    layout = Layout(lanes, per_lane, 2 if lanes % 2 == 0 else 1, 1, 1)
    lo, hi = layout.rank_lanes()
    block = plan.lane_samples(arr, PlanParams(5), 0, lanes, lo, hi)
    full = plan.sequence(block, layout, Progress())
    done = data.draw(st.integers(0, len(full)))
    progress = plan.advance(Progress(), layout, m, done)
    assert plan.sequence(block, layout, progress).tolist() == full[done:].tolist()
    assert plan.rank_batches(m, layout, progress) == len(full) - done
    if progress.into_step:  # mid-step: another layout must refuse it
        import pytest

        other = Layout(lanes, per_lane, 1, 0, 1)
        with pytest.raises(ValueError, match="global batch boundary"):
            plan.sequence(plan.lane_samples(arr, PlanParams(5), 0, lanes, 0, lanes), other,
                          progress)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(0, 60), st.data())
def test_consuming_batches_one_by_one_is_consuming_their_sum(lanes_per_rank, per_lane, world,
                                                             lane_len, data) -> None:
    """What lets the loader count batches and fold them into its Progress only when it is
    read (``ShardflowLoader.progress``): ``advance`` by ``a`` then ``b`` is ``advance`` by
    ``a + b``, for every grouping of an epoch's batches (the last one shorter)."""
    step = lanes_per_rank * per_lane
    batch = data.draw(st.sampled_from([d for d in range(1, step + 1) if step % d == 0]))
    layout = Layout(lanes_per_rank * world, per_lane, world, world - 1, batch)
    total = lane_len * lanes_per_rank
    sizes = [min(batch, total - lo) for lo in range(0, total, batch)]
    one_by_one = [Progress()]
    for n in sizes:
        one_by_one.append(plan.advance(one_by_one[-1], layout, lane_len, n))
    assert plan.rank_batches(lane_len, layout, one_by_one[-1]) == 0
    cuts = sorted({0, len(sizes), *data.draw(st.lists(st.integers(0, len(sizes)), max_size=6))})
    folded = Progress()
    for a, b in zip(cuts, cuts[1:], strict=False):
        folded = plan.advance(folded, layout, lane_len, sum(sizes[a:b]))
        assert folded == one_by_one[b]


@given(st.lists(st.integers(1, 40), min_size=1, max_size=60), seeds, st.integers(1, 6),
       st.integers(1, 8))
def test_a_lane_holds_at_most_a_window_of_blocks_open(sizes, seed, window, lanes) -> None:
    arr = np.array(sizes, dtype=np.int64)
    n = int(arr.sum())
    whole = plan.lane_samples(arr, PlanParams(seed, True, window), 0, lanes, 0, lanes)
    starts = np.concatenate([[0], np.cumsum(arr)])
    for j in range(lanes):
        real = (j + 1) * n // lanes - j * n // lanes
        block_of = np.searchsorted(starts, whole[j, :real], side="right") - 1
        left = {b: int(c) for b, c in zip(*np.unique(block_of, return_counts=True),
                                          strict=True)}
        open_blocks: set[int] = set()
        most = 0
        for b in block_of.tolist():
            left[b] -= 1
            open_blocks.add(b)
            most = max(most, len(open_blocks))
            if left[b] == 0:
                open_blocks.discard(b)
        assert most <= window


@given(st.lists(st.integers(1, 40), min_size=1, max_size=80), seeds, st.integers(1, 4),
       st.integers(2, 8))
def test_blocks_shared_by_two_lanes_are_used_by_both_near_the_end(sizes, seed, window,
                                                                  lanes) -> None:
    """A reader of neighbouring lanes holds a cut block only for ~ the last windows."""
    arr = np.array(sizes, dtype=np.int64)
    whole = plan.lane_samples(arr, PlanParams(seed, True, window), 0, lanes, 0, lanes)
    starts = np.concatenate([[0], np.cumsum(arr)])
    blocks = np.searchsorted(starts, whole, side="right") - 1
    longest = window * int(arr.max())  # a lane's last two segments hold at most this many
    for j in range(lanes - 1):
        shared = set(blocks[j].tolist()) & set(blocks[j + 1].tolist())
        for b in shared:
            first_use = min(np.flatnonzero(blocks[j] == b)[0], np.flatnonzero(blocks[j + 1]
                                                                                 == b)[0])
            assert first_use >= whole.shape[1] - 2 * longest - 1


def test_ranks_read_about_one_wth_of_the_row_groups() -> None:
    sizes = np.full(1000, 50)
    lanes, world = 64, 8
    owners = []
    for r in range(world):
        lo, hi = Layout(lanes, 1, world, r).rank_lanes()
        ids = plan.lane_samples(sizes, PlanParams(1, True, 4), 0, lanes, lo, hi)
        owners.append(set((ids.reshape(-1) // 50).tolist()))
    assert all(len(o) <= 1000 // world + 2 for o in owners)
    shared = sum(len(owners[a] & owners[b]) for a in range(world) for b in range(a + 1, world))
    assert shared <= world - 1  # only the blocks cut by a rank boundary


def test_samples_stay_inside_row_groups() -> None:
    counts = plan.group_samples(np.array([10, 4, 11]), 4)  # with seq_len 4: 2, 0 and 2
    assert counts.tolist() == [2, 0, 2]
    ids = plan.lane_samples(counts, PlanParams(shuffle=False), 0, 1, 0, 1)
    assert ids.tolist() == [[0, 1, 2, 3]]


@given(st.lists(st.integers(0, 100), max_size=200), st.data())
def test_prefix_at_matches_cumsum(sizes, data) -> None:
    arr = np.array(sizes, dtype=np.int64)
    idx = data.draw(st.lists(st.integers(0, max(0, len(sizes) - 1)), max_size=30)) if sizes \
        else []
    ex = np.cumsum(arr) - arr
    assert plan.prefix_at(arr, np.array(idx, dtype=np.int64), chunk=7).tolist() == \
        ex[idx].tolist()


def test_layout_rules() -> None:
    import pytest

    with pytest.raises(ValueError, match="does not divide the plan's 8 lanes"):
        Layout(8, 1, 3)
    with pytest.raises(ValueError, match="batch size 3 does not divide"):
        Layout(8, 1, 2, 0, 3)
    assert Layout(8, 2, 2, 1, 4).rank_lanes() == (4, 8)


@settings(max_examples=300)
@given(st.lists(st.integers(0, 9), max_size=60), seeds, windows, st.integers(1, 9),
       st.booleans(), runs, st.data())
def test_scan_from_either_end_in_any_chunks_finds_the_range(sizes, seed, window, chunk,
                                                            shuffle, run, data) -> None:
    """The scan over the permuted blocks, forward or backward, in chunks of any size, gives
    the blocks overlapping [lo, hi) and the window starts inside, as one pass over all."""
    arr = np.array(sizes, dtype=np.uint8)
    total = int(arr.sum())
    lo = data.draw(st.integers(0, total))
    hi = data.draw(st.integers(lo, total))
    perm = plan.block_permutation(len(sizes), PlanParams(seed, shuffle, 2, run), 0)
    slots = perm.n if perm is not None else len(sizes)  # run-padded: empty slots at the end
    g = perm(np.arange(slots)) if perm is not None else np.arange(slots)
    s = np.concatenate([arr, np.zeros(slots - len(sizes), np.uint8)])[g].astype(np.int64)
    first = np.cumsum(s) - s
    keep = (first + s > lo) & (first < hi) & (s > 0)
    cut = (np.arange(slots) % window == 0) & (first >= lo) & (first < hi)
    want = [g[keep], first[keep], s[keep], first[cut]] if keep.any() else [[]] * 4
    for backward in (False, True):
        got = plan._scan(arr, perm, lo, hi, window, chunk, total, backward)
        assert [x.tolist() for x in got] == [np.asarray(w).tolist() for w in want]


@given(st.integers(0, 1 << 24), st.integers(1, 4096), st.integers(0, 1 << 24),
       st.integers(1, 4096))
def test_auto_run_blocks_is_the_longest_run_that_leaves_enough_runs(
        n: int, lanes: int, n2: int, lanes2: int) -> None:
    k = plan.auto_run_blocks(n, lanes)
    floor = max(plan.AUTO_MIN_RUNS, plan.AUTO_RUNS_PER_LANE * lanes)
    assert k & (k - 1) == 0 and 1 <= k <= plan.AUTO_MAX_RUN_BLOCKS  # a power of two
    if k > 1:
        assert n // k >= floor  # enough runs to shuffle, 8 per lane
    if k < plan.AUTO_MAX_RUN_BLOCKS:
        assert n // (2 * k) < floor  # and no longer run would leave enough
    # more row groups never shorten the runs; more lanes never lengthen them
    if n2 >= n:
        assert plan.auto_run_blocks(n2, lanes) >= k
    if lanes2 >= lanes:
        assert plan.auto_run_blocks(n, lanes2) <= k


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 12), seeds)
def test_an_unset_run_blocks_is_the_resolved_one(n_blocks: int, lanes: int, seed: int) -> None:
    """``run_blocks=None`` orders exactly like the value it resolves to (lane_samples and the
    streamed columns), and a value set on purpose is never replaced."""
    sizes = np.full(n_blocks, 3, dtype=np.int64)
    auto = PlanParams(seed)
    fixed = auto.resolved(n_blocks, lanes)
    assert fixed.run_blocks == plan.auto_run_blocks(n_blocks, lanes)
    assert PlanParams(seed, run_blocks=5).resolved(n_blocks, lanes).run_blocks == 5
    want = plan.lane_samples(sizes, fixed, 2, lanes, 0, lanes)
    assert np.array_equal(plan.lane_samples(sizes, auto, 2, lanes, 0, lanes), want)
    cols = plan.LanePlan(sizes, auto, 2, lanes, 0, lanes)
    assert np.array_equal(cols.columns(0, cols.m), want)
    with pytest.raises(ValueError, match="resolve"):
        plan.block_permutation(n_blocks, auto, 0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 8), st.integers(0, 3))
def test_a_run_longer_than_the_dataset_is_one_run_of_it_all(n_blocks: int, lanes: int,
                                                             seed: int) -> None:
    """``run_blocks`` beyond the row groups orders exactly like a run of all of them, and
    costs no more (no domain padded to a billion slots)."""
    import time

    sizes = np.full(n_blocks, 3, dtype=np.int64)
    want = plan.lane_samples(sizes, PlanParams(seed, run_blocks=n_blocks), 1, lanes, 0, lanes)
    t0 = time.perf_counter()
    huge = plan.lane_samples(sizes, PlanParams(seed, run_blocks=10**12), 1, lanes, 0, lanes)
    assert time.perf_counter() - t0 < 60  # a stall bound: a padded domain never finishes
    assert np.array_equal(huge, want)
    perm = plan.block_permutation(n_blocks, PlanParams(seed, run_blocks=10**12), 1)
    assert perm is not None and perm.n == n_blocks  # no padding
    assert perm(np.arange(n_blocks)).tolist() == list(range(n_blocks))  # one run: in order
