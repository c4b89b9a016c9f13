"""benchmarks/footer_memory.py: a reader keeps every shard footer it parsed; with the shards'
codecs in the index it reads and keeps none."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.footer_memory import measure


def test_footers_from_the_index_keep_no_memory_per_shard(tmp_path: Path) -> None:
    args = argparse.Namespace(shards=6, groups_per_shard=400, row_group_tokens=256, runs=1)
    results = measure(args, tmp_path)
    own, made = results["rows"]
    assert (own["variant"], made["variant"]) == ("shard footers", "footers from the index")
    assert own["footers_read"] == 6 and made["footers_read"] == 0  # warm shard included
    # 5 footers of 400 row groups parsed and kept (~1.8 KB each), against none
    assert own["bytes_per_row_group"] > 500
    assert made["bytes_per_row_group"] < own["bytes_per_row_group"] / 4
