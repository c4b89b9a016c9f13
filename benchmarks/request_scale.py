"""Requests per billion tokens from an object store, as the dataset grows: the real plan and
the real request planner, no I/O.

A rank's reads from an object store are *units* (:mod:`loaders.coalesce`): a row group plus
the row groups of the same shard that the rank uses within the next ``window`` positions of
its plan, one ranged GET each. On a small dataset a rank's next row groups often share a
shard, so units are large (``loader_throughput.py``'s 50 M tokens: ~23 GETs an epoch); on a
large one the block permutation scatters them over thousands of shards and a unit is one row
group: a GET per ~0.3 MB. ``run_blocks`` (:class:`loaders.permute.RunPermutation`) moves runs
of that many consecutive row groups as one, so a unit holds a run at any size.

For each dataset size (row groups of 256 Ki tokens at ~1.18 bytes a token, the zstd shards of
``loader_throughput.py``; shards of ``--groups-per-shard`` row groups, the pipeline's default
1 GiB partitions) and ``run_blocks``, rank 0 of ``--world`` ranks (``--lanes`` lanes, the
global batch): its first ``--groups`` row groups in first-use order, cut into units by
:class:`loaders.coalesce.UnitPlanner` at the largest window the default read-ahead budget
allows (what :class:`loaders.coalesce.AdaptiveWindow` grows to while the store keeps up).
Reported: row groups and MB per GET, GETs per billion tokens, against litdata's whole 64 MB
chunks of int32 tokens (62.5 GETs per billion tokens, whatever the size); "+footers": with a
GET per shard footer, what a dataset written before shard codecs were recorded costs. The
order's cost of ``run_blocks`` is in ``shuffle_quality.py`` (lane span). ``auto`` is the
loader's default (a plan that leaves ``run_blocks`` unset: :func:`loaders.plan.auto_run_blocks`
of the row groups and lanes). A second table, at 1 T tokens: the lanes per rank (4 to 32, the
per-rank batch) at the default read-ahead budget and at the budget that holds a run per lane
(``(lanes per rank x run_blocks + lookahead)`` decoded row groups): a request takes a whole
run only when the budget holds one per lane.

    python benchmarks/request_scale.py          # 2 B .. 1 T tokens, seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, write_results  # noqa: E402
from loaders import plan  # noqa: E402
from loaders.coalesce import plan_units, run_per_lane_bytes, window_cap  # noqa: E402
from loaders.prefetch import COALESCE_MAX_BYTES_CAP, COALESCE_WINDOW  # noqa: E402
from loaders.settings import ReadSettings  # noqa: E402

ROW_GROUP_TOKENS = 256 * 1024
SEQ = 2048
BYTES_PER_TOKEN = 1.18  # zstd GPT-2 shards (loader_throughput.py: 59.1 MB for 50 M tokens)
LITDATA_GETS_PER_GTOK = 1e9 / (64e6 / 4)  # whole 64 MB chunks of int32 tokens: 62.5
READ = ReadSettings()  # the loader's defaults: read-ahead budget and lookahead


def rank_order(n_groups: int, run_blocks: int, lanes: int, world: int, groups: int
               ) -> list[int]:
    """Rank 0's row groups in first-use order (its first ``groups`` of them)."""
    per_group = ROW_GROUP_TOKENS // (SEQ + 1)
    sizes = np.full(n_groups, per_group, dtype=np.int64)
    params = plan.PlanParams(0, True, plan.DEFAULT_WINDOW_BLOCKS, run_blocks)
    lanes_per_rank = lanes // world
    lane_plan = plan.LanePlan(sizes, params, 0, lanes, 0, lanes_per_rank)
    order: list[int] = []
    seen: set[int] = set()
    step = max(1, groups * per_group // lanes_per_rank // 8)
    for c0 in range(0, lane_plan.m, step):
        seq = plan.arrange(lane_plan.columns(c0, min(c0 + step, lane_plan.m)), 1)
        for g in (seq // per_group).tolist():
            if g not in seen:
                seen.add(g)
                order.append(g)
        if len(order) >= groups:
            break
    return order[:groups]


def measure(n_tokens: float, setting: int | None, args: argparse.Namespace
            ) -> dict[str, Any]:
    """One dataset size and ``run_blocks`` setting (``None``: the loader's default, resolved
    for these row groups and lanes)."""
    n_groups = max(2, int(n_tokens // ROW_GROUP_TOKENS))
    run_blocks = plan.PlanParams(run_blocks=setting).resolved(n_groups, args.lanes).run_blocks
    assert run_blocks is not None
    group_bytes = int(ROW_GROUP_TOKENS * BYTES_PER_TOKEN)
    t0 = time.perf_counter()
    order = rank_order(n_groups, run_blocks, args.lanes, args.world, args.groups)
    shard_of = np.arange(n_groups, dtype=np.int64) // args.groups_per_shard
    offset = (np.arange(n_groups, dtype=np.int64) % args.groups_per_shard) * group_bytes
    length = np.full(n_groups, group_bytes, dtype=np.int64)
    decoded = ROW_GROUP_TOKENS * 2  # uint16 tokens held per decoded row group
    budget = getattr(args, "readahead_bytes", None) or READ.readahead_bytes
    window = window_cap(budget, decoded, READ.lookahead_groups,
                        min(COALESCE_WINDOW, 8 * READ.lookahead_groups))
    units = plan_units(order, shard_of, offset, length, window, COALESCE_MAX_BYTES_CAP)
    per_get = len(order) / len(units)
    # Footers: a dataset whose index records the shards' codecs (written since b786e2e) is
    # decoded under footers made from the index: no footer GET (the GETs/Gtok column). One
    # written before: a reader fetches each shard's footer once, with the first request to
    # that shard when it lies within the hole read through, else as a GET of its own; over
    # the rank's epoch one per shard it touches (the "+footers" column).
    rank_groups, rank_shards = epoch_share(n_groups, run_blocks, args)
    data_gets = rank_groups / per_get
    gtok = rank_groups * ROW_GROUP_TOKENS / 1e9
    return {"tokens": n_tokens, "row_groups": n_groups, "readahead_bytes": budget,
            "setting": "auto" if setting is None else setting, "run_blocks": run_blocks,
            "window": window, "groups_seen": len(order), "gets": len(units),
            "groups_per_get": per_get, "mb_per_get": per_get * group_bytes / 1e6,
            "gets_per_gtok": 1e9 / (per_get * ROW_GROUP_TOKENS),
            "x_litdata_gets": 1e9 / (per_get * ROW_GROUP_TOKENS) / LITDATA_GETS_PER_GTOK,
            "rank_epoch_groups": rank_groups, "rank_epoch_shards": rank_shards,
            "with_footers_gets_per_gtok": (data_gets + rank_shards) / gtok,
            "with_footers_x_litdata": (data_gets + rank_shards) / gtok / LITDATA_GETS_PER_GTOK,
            "seconds": time.perf_counter() - t0}


def lanes_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """At 1 T tokens with the default ``run_blocks``: requests as the lanes per rank grow
    (the per-rank batch), at the default read-ahead budget and at the budget that holds a
    run per lane, ``(lanes per rank x run_blocks + lookahead)`` decoded row groups."""
    rows = []
    n_groups = int(1e12 // ROW_GROUP_TOKENS)
    for per_rank in (4, 8, 16, 32):
        lanes = per_rank * args.world
        run = plan.auto_run_blocks(n_groups, lanes)
        whole = run_per_lane_bytes(per_rank, run, READ.lookahead_groups, ROW_GROUP_TOKENS * 2)
        for budget in (READ.readahead_bytes, whole):
            sub = argparse.Namespace(**{**vars(args), "lanes": lanes, "readahead_bytes": budget})
            r = measure(1e12, None, sub)
            r["lanes_per_rank"] = per_rank
            r["budget"] = "default" if budget == READ.readahead_bytes else "a run per lane"
            rows.append(r)
    return rows


def epoch_share(n_groups: int, run_blocks: int, args: argparse.Namespace) -> tuple[int, int]:
    """Rank 0's row groups over a whole epoch (its contiguous 1/world of the permuted
    blocks) and the shards they lie in."""
    params = plan.PlanParams(0, True, plan.DEFAULT_WINDOW_BLOCKS, run_blocks)
    perm = plan.block_permutation(n_groups, params, 0)
    assert perm is not None
    share = -(-perm.n // args.world)
    groups = perm(np.arange(share, dtype=np.int64))
    groups = groups[groups < n_groups]
    return len(groups), len(np.unique(groups // args.groups_per_shard))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for setting in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == setting]
        label = ("Shardflow, default (auto: " + "/".join(str(r["run_blocks"]) for r in mine)
                 + ")" if setting == "auto" else f"Shardflow, run_blocks={setting}")
        ax.plot([r["tokens"] for r in mine], [r["gets_per_gtok"] for r in mine],
                "s-" if setting == "auto" else "o-", label=label)
    ax.axhline(LITDATA_GETS_PER_GTOK, color="grey", ls="--", label="litdata (64 MB chunks)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("dataset tokens")
    ax.set_ylabel("GETs per billion tokens (rank 0)")
    ax.set_title("object-store requests as the dataset grows")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=64, help="ranks")
    parser.add_argument("--lanes", type=int, default=512, help="lanes (the global batch)")
    parser.add_argument("--groups", type=int, default=8000,
                        help="rank 0's first row groups to plan requests for")
    parser.add_argument("--groups-per-shard", type=int, default=1000)
    parser.add_argument("--runs", default="auto,1,16,32,64",
                        help="run_blocks values ('auto': the loader's default, unset)")
    args = parser.parse_args()
    sizes = (2e9, 1e10, 1e11, 1e12)
    rows = []
    print(f"rank 0 of {args.world} ranks, {args.lanes} lanes; shards of "
          f"{args.groups_per_shard} row groups; litdata: {LITDATA_GETS_PER_GTOK:.1f} GETs/Gtok")
    print(f"{'tokens':>8} {'run_blocks':>12} {'groups/GET':>10} {'MB/GET':>7} "
          f"{'GETs/Gtok':>9} {'x litdata':>9} {'+footers':>9} {'x litdata':>9}  (+footers: an "
          "index without shard codecs)")
    for rb in (None if x == "auto" else int(x) for x in args.runs.split(",")):
        for n in sizes:
            r = measure(n, rb, args)
            rows.append(r)
            name = f"auto={r['run_blocks']}" if rb is None else str(rb)
            print(f"{n:8.0e} {name:>12} {r['groups_per_get']:10.2f} {r['mb_per_get']:7.2f} "
                  f"{r['gets_per_gtok']:9.1f} {r['x_litdata_gets']:9.2f} "
                  f"{r['with_footers_gets_per_gtok']:9.1f} {r['with_footers_x_litdata']:9.2f}   "
                  f"({r['seconds']:.1f} s)", flush=True)
    print(f"\n1 T tokens, the default run_blocks, rank 0 of {args.world}: lanes per rank "
          "(the per-rank batch) against the read-ahead budget")
    print(f"{'lanes/rank':>10} {'run_blocks':>10} {'budget':>15} {'MiB':>6} {'groups/GET':>10} "
          f"{'x litdata':>9}")
    sweep = lanes_sweep(args)
    for r in sweep:
        print(f"{r['lanes_per_rank']:10d} {r['run_blocks']:10d} {r['budget']:>15} "
              f"{r['readahead_bytes'] / 2**20:6.0f} {r['groups_per_get']:10.2f} "
              f"{r['x_litdata_gets']:9.2f}", flush=True)
    results = {"world": args.world, "lanes": args.lanes, "groups": args.groups,
               "groups_per_shard": args.groups_per_shard,
               "litdata_gets_per_gtok": LITDATA_GETS_PER_GTOK, "rows": rows,
               "lanes_sweep": sweep}
    path = write_results("request_scale", results)
    plot(rows, RESULTS / "request_scale.png")
    print(f"results: {path} and {RESULTS / 'request_scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
