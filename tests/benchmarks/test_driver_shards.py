"""benchmarks/driver_shards.py: the folded shard table holds a fraction of the ShardInfo
objects' memory in the driver and writes the same index."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.driver_shards import VARIANTS, run_one

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_holds_less_and_writes_the_same_index() -> None:
    before, now = (run_one(v, 20, 200) for v in VARIANTS)
    assert before["index_sha256"] == now["index_sha256"]
    assert now["holding_bytes"] < before["holding_bytes"] / 4, (before, now)
    assert now["peak_bytes"] < before["peak_bytes"], (before, now)


def test_the_script_prints_writes_and_plots(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "benchmarks/driver_shards.py", "--partitions", "5",
                          "--groups", "50", "--runs", "1", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "B/row group held" in out.stdout and "less (the table against" in out.stdout
    results = json.loads((tmp_path / "driver_shards.json").read_text())
    assert results["row_groups"] == 250 and set(results["variants"]) == set(VARIANTS)
    assert (tmp_path / "driver_shards.png").stat().st_size > 1000
