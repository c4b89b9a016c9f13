"""benchmarks/driver_shards.py: the shard table on disk holds a fraction of the ShardInfo
objects' memory in the driver, makes the same index, and its peak does not grow with the row
groups."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.driver_shards import RUNS, VARIANTS, run_one

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_holds_less_and_writes_the_same_index() -> None:
    before, now = (run_one(v, 20, 200) for v in VARIANTS)
    assert before["index_sha256"] == now["index_sha256"]
    assert now["holding_bytes"] < before["holding_bytes"] / 4, (before, now)
    assert now["peak_bytes"] < before["peak_bytes"], (before, now)


def test_the_tables_peak_stays_flat_as_the_row_groups_grow() -> None:
    """x3 the row groups, both well past a chunk (65,536) and a read (4 MB of records): the
    peak stays where it was (~13 MB here), where the objects' grows with every row group."""
    small, large = (run_one(VARIANTS[1], parts, 1000) for parts in (280, 840))
    assert small["index_bytes"] * 2.9 < large["index_bytes"]
    assert large["peak_bytes"] < small["peak_bytes"] * 1.15, (small, large)


def test_the_script_prints_writes_and_plots(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "benchmarks/driver_shards.py", "--partitions", "5",
                          "--groups", "50", "--runs", "1", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "B/row group), peak" in out.stdout and "less (the table against" in out.stdout
    results = json.loads((tmp_path / "driver_shards.json").read_text())
    assert results["row_groups"] == 250 and set(results["variants"]) == set(RUNS)
    assert results["variants"][RUNS[2]]["row_groups"] == 250 * results["scale"]
    assert (tmp_path / "driver_shards.png").stat().st_size > 1000
