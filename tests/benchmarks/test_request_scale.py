"""benchmarks/request_scale.py: on a dataset far larger than the read-ahead, a rank's requests
are one row group each unless runs of row groups are permuted together (run_blocks)."""

from __future__ import annotations

import argparse

from benchmarks.request_scale import measure


def test_runs_keep_requests_large_at_scale() -> None:
    args = argparse.Namespace(world=64, lanes=512, groups=600, groups_per_shard=1000)
    single = measure(1e11, 1, args)
    runs = measure(1e11, 16, args)
    assert single["groups_seen"] == runs["groups_seen"] == 600
    assert single["groups_per_get"] < 2  # scattered: about a row group per GET
    assert runs["groups_per_get"] > 8 * single["groups_per_get"]
    assert runs["gets_per_gtok"] * 8 < single["gets_per_gtok"]
    for r in (single, runs):  # every shard touched costs its footer once
        assert 0 < r["rank_epoch_shards"] <= r["rank_epoch_groups"]
        assert r["with_footers_gets_per_gtok"] > r["gets_per_gtok"]


def test_the_default_resolves_to_runs_at_scale() -> None:
    """Left unset (``None``: the loader's default), run_blocks is resolved from the row groups
    and lanes: the longest runs at 100 B tokens, so the default's requests are the runs'
    size, close to litdata's count per token (whole 64 MB chunks)."""
    from loaders.plan import AUTO_MAX_RUN_BLOCKS

    args = argparse.Namespace(world=64, lanes=512, groups=4000, groups_per_shard=1000)
    auto = measure(1e11, None, args)
    assert (auto["setting"], auto["run_blocks"]) == ("auto", AUTO_MAX_RUN_BLOCKS)
    assert auto["gets"] == measure(1e11, AUTO_MAX_RUN_BLOCKS, args)["gets"]
    assert auto["x_litdata_gets"] < 1.5


def test_rounds_rotate_each_storage_group() -> None:
    """No loader is the first to read from the S3 server (or from local disk) in every round
    of the interleaved benchmark."""
    from benchmarks.loader_throughput import DEFAULT_CONFIGS, rotated

    firsts = set()
    for r in range(3):
        order = rotated(DEFAULT_CONFIGS, r)
        assert sorted(order) == sorted(DEFAULT_CONFIGS)
        assert ["_s3" in c for c in order] == ["_s3" in c for c in DEFAULT_CONFIGS]
        firsts.add(next(c for c in order if "_s3" in c))
    assert len(firsts) == 3


def test_a_budget_of_a_run_per_lane_keeps_whole_run_requests() -> None:
    """At 1 T tokens, on the real plan and request planner: the loader's defaults agree with
    each other, 8 lanes per rank fit whole default runs in the default read-ahead budget;
    16 do not (a run goes in two requests) until the budget holds a run per lane."""
    from benchmarks.request_scale import READ, lanes_sweep
    from loaders.coalesce import READAHEAD_BYTES
    from loaders.plan import AUTO_MAX_RUN_BLOCKS

    assert READ.readahead_bytes == READAHEAD_BYTES

    args = argparse.Namespace(world=64, lanes=512, groups=3000, groups_per_shard=1000)
    rows = {(r["lanes_per_rank"], r["budget"]): r for r in lanes_sweep(args)}
    eight = rows[(8, "default")]
    assert eight["run_blocks"] == AUTO_MAX_RUN_BLOCKS
    assert eight["groups_per_get"] > 0.75 * eight["run_blocks"]
    default16, whole16 = rows[(16, "default")], rows[(16, "a run per lane")]
    assert default16["groups_per_get"] < 0.6 * default16["run_blocks"]
    assert whole16["groups_per_get"] > 1.5 * default16["groups_per_get"]
    assert whole16["readahead_bytes"] > default16["readahead_bytes"]
