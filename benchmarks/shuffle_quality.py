"""Shuffle quality of the sample plan vs the one-stream plan it replaced, a py1e-style block
shuffle and a full permutation, on a cluster-shaped job.

All orders are pure functions of integers (no I/O), computed for a realistic dataset shape:
``--tokens`` tokens (default 2 B) in row groups of 256 Ki tokens, samples of 2049 tokens, read
by ``--world`` ranks (8) of ``--batch`` samples each (8): global batches of 64.

Quality, on the *global* sequence (global batch after global batch, each rank's part in rank
order; what the optimizer sees):

- **neighbour distance**: for consecutive outputs, ``|src[i+1] - src[i]|`` in samples, as a
  fraction of the dataset (a full permutation gives a mean of ~1/3). Median and mean.
- **window diversity**: for every window of 64 consecutive outputs (one global batch here),
  the number of distinct row groups its samples come from (full permutation ~64), and the
  fraction of windows with more than ``k`` = 32.
- **batch duplicates**: share of a global batch's samples that share a row group with another
  sample of the same global batch (0 for a full permutation).
- **regions per batch**: distinct *regions* (64 consecutive row groups of the input order,
  16 M tokens: one litdata chunk) among a global batch's samples, mean. Every order visits
  regions at the same rate (the tokens read per step); this says how many it draws from at
  once (a full permutation: ~the batch size).

Cost, on rank 0's sequence (what one reader reads):

- **reads per group**: row-group reads of a reader with an LRU cache of ``--lru`` (16) decoded
  row groups, over the distinct row groups the rank needs (1.0 = each read once);
- **read-once memory**: the most row groups a reader must hold at once to read each group only
  once (what Shardflow's prefetcher holds: a group from first to last use);
- **rank's share**: distinct row groups rank 0 reads, over all row groups (ideal: 1/world).
- **lane span**: for each of rank 0's lanes (every ``batch``-th sample of its sequence), the
  span of source row groups (max - min + 1) that 1,024 consecutive samples of it draw from,
  median: how long a lane dwells in one region of the input order (``run_blocks`` trades
  this for request size; the global batch's mixing above is unchanged by it).

Orders compared:

- ``shardflow default``: :func:`loaders.plan.lane_samples` as the loader calls it by default:
  one lane per sample of the global batch, ranks owning contiguous lanes, ``run_blocks`` left
  unset (:func:`loaders.plan.auto_run_blocks` of the row groups and lanes).
- ``shardflow lanes (window_blocks=w)``: the same with single blocks (``run_blocks=1``, the
  default before runs).
- ``shardflow lanes (window_blocks=2, run_blocks=r)``: the same with ``run_blocks`` (runs of
  ``r`` consecutive row groups permuted as one, so a rank reads ``r`` neighbours per request
  from an object store at any dataset size).
- ``one stream (before, window_blocks=16)``: the previous plan (blocks shuffled, samples
  shuffled within windows of 16 blocks, one global order cut into contiguous rank slices),
  reproduced below; its global batch was the ranks' batches at one step, so it depended on
  the world size.
- ``py1e-style``: a block shuffle in the style of MosaicML streaming's default ``py1e``,
  written here from its description (single canonical node): shards shuffled, each shard's
  samples placed at random inside a range of ``shuffle_block_size`` samples centred on its
  span, sorted by position; ranks take contiguous slices. Shards are MDS-sized (8192 samples).
- ``litdata-style``: litdata's ``FullShuffle`` (0.2.x, written here from its source): its
  64 MB chunks of int32 tokens (~8,190 samples) permuted, the list cut into contiguous rank
  shares (one DataLoader worker per rank), each chunk's samples in aligned blocks of 256,
  shuffled inside and in block order: a rank's batch comes from one chunk.
- ``full permutation``: a uniform permutation (best quality, worst reads).

    python benchmarks/shuffle_quality.py            # 2 B tokens
    python benchmarks/shuffle_quality.py --quick    # 200 M tokens
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, write_results  # noqa: E402
from loaders import plan  # noqa: E402

SEQ = 2048
WIDTH = SEQ + 1
ROW_GROUP_TOKENS = 256 * 1024
PER_GROUP = ROW_GROUP_TOKENS // WIDTH  # samples per row group
STRETCH = 1024  # consecutive samples of one lane whose source span is measured
MDS_SHARD_SAMPLES = 8192
#: litdata's TokensLoader: a 64 MB chunk of int32 tokens holds this many 2049-token samples
LITDATA_CHUNK_SAMPLES = (64 << 20) // (WIDTH * 4)
LITDATA_ITEM_WINDOW = 256  # FullShuffle's default item window (aligned blocks, shuffled)
#: a *region*: 64 row groups (16 M tokens, one litdata chunk) of the input order
REGION_GROUPS = 64
WINDOW = 64
BATCH = 8


def py1e_style(n_samples: int, shard_samples: int, block: int, seed: int) -> np.ndarray:
    """A py1e-like order: shuffled shards, each spread uniformly over ``block`` positions."""
    rng = np.random.default_rng(seed)
    sizes = np.full(-(-n_samples // shard_samples), shard_samples, dtype=np.int64)
    sizes[-1] = n_samples - shard_samples * (len(sizes) - 1)
    shard_starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    perm = rng.permutation(len(sizes))
    placed_sizes = sizes[perm]
    placed_starts = np.concatenate([[0], np.cumsum(placed_sizes)[:-1]])
    keys = np.empty(n_samples, dtype=np.float64)
    ids = np.empty(n_samples, dtype=np.int64)
    pos = 0
    for shard, size, where in zip(perm.tolist(), placed_sizes.tolist(), placed_starts.tolist(),
                                  strict=True):
        centre = where + size / 2
        span = max(block, size)
        lo = min(max(centre - span / 2, 0), max(n_samples - span, 0))
        keys[pos:pos + size] = lo + rng.random(size) * span
        ids[pos:pos + size] = np.arange(shard_starts[shard], shard_starts[shard] + size)
        pos += size
    return ids[np.argsort(keys, kind="stable")]


def litdata_style(n_samples: int, chunk_samples: int, item_window: int, seed: int
                  ) -> np.ndarray:
    """litdata's ``FullShuffle`` (0.2.x), written here from its source: chunks permuted, the
    shuffled list cut into contiguous per-rank shares (one DataLoader worker each), each
    chunk's items in aligned blocks of ``item_window``, shuffled inside and in block order."""
    n_chunks = -(-n_samples // chunk_samples)
    perm = np.random.RandomState([seed, 1]).permutation(n_chunks)
    parts = []
    for c in perm.tolist():
        items = np.arange(c * chunk_samples, min((c + 1) * chunk_samples, n_samples))
        rng = np.random.RandomState([seed, n_chunks, 1, c])
        blocks = [rng.permutation(items[i:i + item_window])
                  for i in range(0, len(items), item_window)]
        parts.extend(blocks[b] for b in rng.permutation(len(blocks)).tolist())
    return np.concatenate(parts)


def one_stream_order(sizes: np.ndarray, seed: int, epoch: int, window_blocks: int
                     ) -> np.ndarray:
    """The previous plan's global order (the previous plan's ``block_order``, before the lanes)."""
    n = int(sizes.sum())
    rng = np.random.default_rng([0x5EED_F10, seed, epoch])
    perm = rng.permutation(len(sizes))
    starts = np.concatenate([[0], np.cumsum(sizes)])[:-1]
    lengths = sizes[perm]
    base = np.repeat(starts[perm] - np.concatenate([[0], np.cumsum(lengths)])[:-1], lengths)
    ids = base + np.arange(n, dtype=np.int64)
    window = np.repeat(np.arange(len(perm)) // max(1, window_blocks), lengths)
    return ids[np.lexsort((rng.random(n), window))]


def sliced(order: np.ndarray, world: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous rank slices of one order: (global sequence, rank 0's sequence)."""
    per_rank = len(order) // world
    ranks = order[:per_rank * world].reshape(world, per_rank)
    steps = per_rank // batch
    glob = ranks[:, :steps * batch].reshape(world, steps, batch).transpose(1, 0, 2).reshape(-1)
    return glob, ranks[0]


def lanes_order(sizes: np.ndarray, seed: int, window_blocks: int, world: int, batch: int,
                run_blocks: int | None = 1) -> tuple[np.ndarray, np.ndarray]:
    """The loader's plan: (global sequence, rank 0's sequence)."""
    lanes = world * batch
    params = plan.PlanParams(seed, True, window_blocks, run_blocks)
    ranks = []
    for r in range(world):
        layout = plan.Layout(lanes, 1, world, r)
        lo, hi = layout.rank_lanes()
        ranks.append(plan.sequence(plan.lane_samples(sizes, params, 0, lanes, lo, hi), layout,
                                   plan.Progress()))
    steps = len(ranks[0]) // batch
    glob = np.stack([r[:steps * batch].reshape(steps, batch) for r in ranks], axis=1)
    return glob.reshape(-1), ranks[0]


def lru_reads(group: np.ndarray, capacity: int) -> int:
    """Row-group reads of a reader with an LRU of ``capacity`` decoded groups."""
    cache: OrderedDict[int, None] = OrderedDict()
    reads = 0
    prev = -1
    for g in group.tolist():
        if g == prev:
            continue  # same group as the previous sample: certainly cached
        prev = g
        if g in cache:
            cache.move_to_end(g)
        else:
            reads += 1
            cache[g] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return reads


def read_once_peak(group: np.ndarray, n_groups: int) -> int:
    """Most row groups a reader must hold at once to read every group only once per epoch.

    A group is needed from its first use to its last; holding it in between is the price of
    not reading it again. (Shardflow's prefetcher does exactly this.)
    """
    idx = np.arange(len(group))
    first_use = np.full(n_groups, len(group))
    np.minimum.at(first_use, group, idx)
    last_use = np.full(n_groups, -1)
    np.maximum.at(last_use, group, idx)
    used = last_use >= 0
    delta = np.zeros(len(group) + 1, dtype=np.int64)
    np.add.at(delta, first_use[used], 1)
    np.add.at(delta, last_use[used] + 1, -1)
    return int(np.cumsum(delta).max())


def stretch_span(rank0: np.ndarray, lanes: int, horizon: int = STRETCH) -> float:
    """Median over rank 0's lanes (every ``lanes``-th sample of its sequence) and their
    stretches of ``horizon`` consecutive samples: the span of source row groups a stretch
    draws from (max - min + 1). Small = the lane dwells in one region of the source (the
    dataset's input order) for that long."""
    spans = []
    for lane in range(lanes):
        g = rank0[lane::lanes].astype(np.int64) // PER_GROUP
        usable = len(g) // horizon * horizon
        if usable:
            w = g[:usable].reshape(-1, horizon)
            spans.append(w.max(axis=1) - w.min(axis=1) + 1)
    return float(np.median(np.concatenate(spans))) if spans else float("nan")


def quality(glob: np.ndarray, rank0: np.ndarray, n_groups: int, lru: int, k: int,
            global_batch: int, lanes: int = 1) -> dict[str, float]:
    n = len(glob)
    dist = np.abs(np.diff(glob.astype(np.int64))) / n
    group = glob.astype(np.int64) // PER_GROUP  # the loader's grid: no sample spans groups
    usable = n // WINDOW * WINDOW
    windows = np.sort(group[:usable].reshape(-1, WINDOW), axis=1)
    distinct = 1 + (np.diff(windows, axis=1) != 0).sum(axis=1)
    batches = np.sort(group[:n // global_batch * global_batch].reshape(-1, global_batch),
                      axis=1)
    same = np.diff(batches, axis=1) == 0
    shared = np.zeros(batches.shape, dtype=bool)
    shared[:, 1:] |= same
    shared[:, :-1] |= same
    regions = np.sort(batches // REGION_GROUPS, axis=1)
    g0 = rank0.astype(np.int64) // PER_GROUP
    needed = len(np.unique(g0))
    reads = lru_reads(g0, lru)
    return {
        "neighbour_distance_mean": float(dist.mean()),
        "neighbour_distance_median": float(np.median(dist)),
        "window_distinct_groups_mean": float(distinct.mean()),
        f"window_frac_over_{k}_groups": float((distinct > k).mean()),
        "batch_share_sharing_a_group": float(shared.mean()),
        "rank0_lru_reads": reads,
        "reads_per_group": reads / needed,
        "read_once_peak_groups": read_once_peak(g0, n_groups),
        "rank0_share_of_groups": needed / n_groups,
        "lane_stretch_span_groups": stretch_span(rank0, lanes),
        "batch_distinct_regions_mean": float(
            (1 + (np.diff(regions, axis=1) != 0).sum(axis=1)).mean()),
    }


def orders(n_samples: int, n_groups: int, seed: int, world: int, batch: int
           ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    sizes = np.full(n_groups, PER_GROUP, dtype=np.int64)
    sizes[-1] = n_samples - PER_GROUP * (n_groups - 1)
    out = {}
    auto = plan.auto_run_blocks(n_groups, world * batch)
    out[f"shardflow default (run_blocks unset: {auto})"] = lanes_order(
        sizes, seed, 2, world, batch, None)
    for wb in (1, 2, 4, 16):
        out[f"shardflow lanes (window_blocks={wb})"] = lanes_order(sizes, seed, wb, world,
                                                                   batch)
    for rb in (8, 16, 32, 64):  # request-sized runs (loaders.permute.RunPermutation)
        out[f"shardflow lanes (window_blocks=2, run_blocks={rb})"] = lanes_order(
            sizes, seed, 2, world, batch, rb)
    out["one stream (before, window_blocks=16)"] = sliced(one_stream_order(sizes, seed, 0, 16),
                                                          world, batch)
    for blk in (1 << 18, 1 << 14):
        out[f"py1e-style (block={blk})"] = sliced(
            py1e_style(n_samples, MDS_SHARD_SAMPLES, blk, seed), world, batch)
    out["litdata-style (FullShuffle, 1 worker per rank)"] = sliced(
        litdata_style(n_samples, LITDATA_CHUNK_SAMPLES, LITDATA_ITEM_WINDOW, seed), world, batch)
    out["full permutation"] = sliced(np.random.default_rng(seed).permutation(n_samples), world,
                                     batch)
    return out


def plot(results: dict[str, Any], k: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["orders"])
    rows = results["orders"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6.5))
    colours = plt.get_cmap("tab20").colors
    for i, name in enumerate(names):
        r = rows[name]
        ax1.scatter(r["reads_per_group"], r["window_distinct_groups_mean"], s=60, label=name,
                    color=colours[i % len(colours)], marker="osD^v<>"[i % 7])
    ax1.set_xscale("log")
    ax1.set_xlabel(f"rank 0's row-group reads / groups it needs (LRU of {results['lru']})")
    ax1.set_ylabel(f"distinct row groups per {WINDOW} consecutive samples (global)")
    ax1.set_title("mixing vs read cost")
    ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    x = np.arange(len(names))
    ax2.bar(x - 0.2, [rows[n]["neighbour_distance_median"] for n in names], 0.4,
            label="median")
    ax2.bar(x + 0.2, [rows[n]["neighbour_distance_mean"] for n in names], 0.4, label="mean")
    ax2.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("|src[i+1] - src[i]| / samples")
    ax2.set_title("distance of output neighbours in source order")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=2e9)
    parser.add_argument("--world", type=int, default=8, help="ranks")
    parser.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    parser.add_argument("--lru", type=int, default=16, help="row groups a reader caches")
    parser.add_argument("--k", type=int, default=32, help="diversity threshold per window")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="200 M tokens")
    args = parser.parse_args()
    n_tokens = int(2e8 if args.quick else args.tokens)
    n_groups = -(-n_tokens // ROW_GROUP_TOKENS)
    n_samples = int(plan.group_samples(np.full(n_groups, ROW_GROUP_TOKENS), SEQ).sum())
    global_batch = args.world * args.batch
    print(f"{n_tokens / 1e9:.1f} B tokens: {n_samples} samples of {WIDTH}, {n_groups} row groups "
          f"of {ROW_GROUP_TOKENS} tokens; {args.world} ranks x {args.batch} = global batches of "
          f"{global_batch}; LRU of {args.lru} groups")
    results: dict[str, Any] = {"tokens": n_tokens, "samples": n_samples, "row_groups": n_groups,
                               "row_group_tokens": ROW_GROUP_TOKENS, "seq_len": SEQ,
                               "world": args.world, "batch": args.batch,
                               "lru": args.lru, "k": args.k, "window": WINDOW, "orders": {}}
    head = (f"{'order':50} {'dist med':>9} {'dist mean':>9} {'distinct/64':>11} "
            f"{'>' + str(args.k):>6} {'dup share':>9} {'reads/group':>11} {'read-once':>9} "
            f"{'rank share':>10} {'lane span':>9} {'regions/batch':>13}")
    print(head)
    print("-" * len(head))
    for name, (glob, rank0) in orders(n_samples, n_groups, args.seed, args.world,
                                      args.batch).items():
        t0 = time.perf_counter()
        q = quality(glob, rank0, n_groups, args.lru, args.k, global_batch, args.batch)
        results["orders"][name] = q
        print(f"{name:50} {q['neighbour_distance_median']:9.4f} "
              f"{q['neighbour_distance_mean']:9.4f} {q['window_distinct_groups_mean']:11.1f} "
              f"{q[f'window_frac_over_{args.k}_groups']:6.2f} "
              f"{q['batch_share_sharing_a_group']:9.3f} {q['reads_per_group']:11.2f} "
              f"{q['read_once_peak_groups']:9d} {q['rank0_share_of_groups']:10.3f} "
              f"{q['lane_stretch_span_groups']:9.0f} {q['batch_distinct_regions_mean']:13.1f}"
              f"   ({time.perf_counter() - t0:.1f} s)")
    name = "shuffle_quality_quick" if args.quick else "shuffle_quality"
    path = write_results(name, results)
    plot(results, args.k, RESULTS / f"{name}.png")
    print(f"results: {path} and {RESULTS / f'{name}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
