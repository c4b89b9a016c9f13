"""Shuffle quality of the sample plan vs a py1e-style block shuffle and a full permutation.

All orders are pure functions of integers (no I/O), computed for a realistic dataset shape:
``--tokens`` tokens (default 2 B) in row groups of 256 Ki tokens, samples of 2049 tokens.

Quality measures (on the epoch order, a permutation of sample ids in source order):

- **neighbour distance**: for consecutive outputs, ``|src[i+1] - src[i]|`` in samples, as a
  fraction of the dataset (a full permutation gives a mean of ~1/3). Median and mean. Small
  distances mean consecutive batches come from the same region of the corpus (same documents,
  same source files).
- **window diversity**: for every window of 64 consecutive outputs (8 batches of 8), the number
  of distinct row groups its samples come from; reported as the mean and as the fraction of
  windows with more than ``k`` = 32 distinct groups. A full permutation gives ~64; a reader
  that walks row groups one at a time gives 1.
- **batch duplicates**: mean number of samples in a batch of 8 that share a row group with
  another sample of the same batch (0 for a full permutation).

Cost measure, **reads per epoch**: how many row-group reads a reader with an LRU cache of
``--lru`` (16) decoded row groups does to produce the order, over the number of row groups
(1.0 = every group read once; a full permutation reads one group per sample).

and **read-once memory**: the most row groups a reader must hold at once to read each group
only once (what Shardflow's prefetcher holds today: it keeps a group from first to last use).

Orders compared:

- ``shardflow``: :func:`loaders.plan.epoch_order` with the loader's defaults
  (blocks of ~one row group, shuffled; samples shuffled within windows of ``window_blocks``
  consecutive blocks), and with wider windows (same cost model, more mixing).
- ``py1e``: a block shuffle in the style of MosaicML streaming's default ``py1e``, written here
  from its description (single canonical node): the order of shards is shuffled, then each
  shard's samples are placed at uniformly random positions inside a range of
  ``shuffle_block_size`` samples centred on the shard's span in the shuffled concatenation, and
  the samples are sorted by position. Shards are MDS-sized (64 MB of 2049-token int32 samples
  = 8192 samples); block sizes: streaming's default ``1 << 18`` and a small one.
- ``full``: a uniform permutation (best quality, worst reads).

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
MDS_SHARD_SAMPLES = 8192
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


def groups_of(order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last row group of each sample (fixed-size row groups)."""
    # The loader's grid: whole windows inside each row group, none spanning two.
    group = order.astype(np.int64) // PER_GROUP
    return group, group


def lru_reads(order: np.ndarray, capacity: int) -> int:
    """Row-group reads of a reader with an LRU of ``capacity`` decoded groups."""
    first, last = groups_of(order)
    cache: OrderedDict[int, None] = OrderedDict()
    reads = 0
    prev_a = prev_b = -1
    for a, b in zip(first.tolist(), last.tolist(), strict=True):
        if a == prev_a and b == prev_b:
            continue  # same groups as the previous sample: certainly cached
        prev_a, prev_b = a, b
        for g in range(a, b + 1):
            if g in cache:
                cache.move_to_end(g)
            else:
                reads += 1
                cache[g] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return reads


def read_once_peak(order: np.ndarray, n_groups: int) -> int:
    """Most row groups a reader must hold at once to read every group only once per epoch.

    A group is needed from its first use to its last; holding it in between is the price of
    not reading it again. (Shardflow's prefetcher, as of this benchmark, does exactly this.)
    """
    first, last = groups_of(order)
    idx = np.arange(len(order))
    first_use = np.full(n_groups, len(order))
    np.minimum.at(first_use, first, idx)
    last_use = np.full(n_groups, -1)
    np.maximum.at(last_use, last, idx)
    used = last_use >= 0
    delta = np.zeros(len(order) + 1, dtype=np.int64)
    np.add.at(delta, first_use[used], 1)
    np.add.at(delta, last_use[used] + 1, -1)
    return int(np.cumsum(delta).max())


def quality(order: np.ndarray, n_groups: int, lru: int, k: int) -> dict[str, float]:
    n = len(order)
    dist = np.abs(np.diff(order.astype(np.int64))) / n
    group, _ = groups_of(order)
    usable = n // WINDOW * WINDOW
    windows = np.sort(group[:usable].reshape(-1, WINDOW), axis=1)
    distinct = 1 + (np.diff(windows, axis=1) != 0).sum(axis=1)
    batches = np.sort(group[:n // BATCH * BATCH].reshape(-1, BATCH), axis=1)
    same = np.diff(batches, axis=1) == 0
    shared = np.zeros(batches.shape, dtype=bool)
    shared[:, 1:] |= same
    shared[:, :-1] |= same
    reads = lru_reads(order, lru)
    return {
        "neighbour_distance_mean": float(dist.mean()),
        "neighbour_distance_median": float(np.median(dist)),
        "window_distinct_groups_mean": float(distinct.mean()),
        f"window_frac_over_{k}_groups": float((distinct > k).mean()),
        "batch_samples_sharing_a_group": float(shared.sum(axis=1).mean()),
        "lru_reads": reads,
        "reads_per_group": reads / n_groups,
        "read_once_peak_groups": read_once_peak(order, n_groups),
    }


def orders(n_samples: int, seed: int) -> dict[str, np.ndarray]:
    block = PER_GROUP  # one block per row group, as in the loader
    out = {}
    for wb in (4, 16, 64):
        out[f"shardflow (window_blocks={wb})"] = plan.epoch_order(n_samples, block, seed, 0,
                                                                  window_blocks=wb)
    for blk in (1 << 18, 1 << 14):
        out[f"py1e-style (block={blk})"] = py1e_style(n_samples, MDS_SHARD_SAMPLES, blk, seed)
    out["full permutation"] = np.random.default_rng(seed).permutation(n_samples)
    return out


def plot(results: dict[str, Any], k: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["orders"])
    rows = results["orders"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in names:
        r = rows[name]
        ax1.scatter(r["reads_per_group"], r["window_distinct_groups_mean"], s=60, label=name)
    ax1.set_xscale("log")
    ax1.set_xlabel(f"row-group reads per epoch / row groups (LRU of {results['lru']})")
    ax1.set_ylabel(f"distinct row groups per {WINDOW} consecutive samples")
    ax1.set_title("mixing vs read cost")
    ax1.legend(fontsize=8)
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
    parser.add_argument("--lru", type=int, default=16, help="row groups a reader caches")
    parser.add_argument("--k", type=int, default=32, help="diversity threshold per window")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="200 M tokens")
    args = parser.parse_args()
    n_tokens = int(2e8 if args.quick else args.tokens)
    n_groups = -(-n_tokens // ROW_GROUP_TOKENS)
    n_samples = int(plan.group_samples(np.full(n_groups, ROW_GROUP_TOKENS), SEQ).sum())
    print(f"{n_tokens / 1e9:.1f} B tokens: {n_samples} samples of {WIDTH}, {n_groups} row groups "
          f"of {ROW_GROUP_TOKENS} tokens; LRU of {args.lru} groups")
    results: dict[str, Any] = {"tokens": n_tokens, "samples": n_samples, "row_groups": n_groups,
                               "row_group_tokens": ROW_GROUP_TOKENS, "seq_len": SEQ,
                               "lru": args.lru, "k": args.k, "window": WINDOW, "orders": {}}
    head = (f"{'order':28} {'dist med':>9} {'dist mean':>9} {'distinct/64':>11} "
            f"{'>' + str(args.k):>6} {'dup/batch':>9} {'reads/group':>11} {'read-once peak':>14}")
    print(head)
    print("-" * len(head))
    for name, order in orders(n_samples, args.seed).items():
        assert np.array_equal(np.sort(order), np.arange(n_samples)), name
        t0 = time.perf_counter()
        q = quality(order, n_groups, args.lru, args.k)
        results["orders"][name] = q
        print(f"{name:28} {q['neighbour_distance_median']:9.4f} "
              f"{q['neighbour_distance_mean']:9.4f} {q['window_distinct_groups_mean']:11.1f} "
              f"{q[f'window_frac_over_{args.k}_groups']:6.2f} "
              f"{q['batch_samples_sharing_a_group']:9.2f} {q['reads_per_group']:11.2f} "
              f"{q['read_once_peak_groups']:14d}"
              f"   ({time.perf_counter() - t0:.1f} s)")
    name = "shuffle_quality_quick" if args.quick else "shuffle_quality"
    path = write_results(name, results)
    plot(results, args.k, RESULTS / f"{name}.png")
    print(f"results: {path} and {RESULTS / f'{name}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
