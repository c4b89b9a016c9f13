"""benchmarks/pipeline_scale.py's one-point form runs the real driver code on a tiny simulated
input and reports every field the issue asks for; the bounded window holds the scheduler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_one_point_reports_the_scale_figures() -> None:
    out = subprocess.run([sys.executable, "benchmarks/pipeline_scale.py", "--input-tb", "1",
                          "--files", "500", "--max-tasks", "200", "--task-ms", "5", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    point = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("driver_peak_rss_mb", "scheduler_peak_rss_mb", "max_live_tasks",
                "first_task_s", "overhead_per_task_ms", "resume_planning_s"):
        assert point[key] >= 0, key
    # 2 GB files: each cut in two (small files would be packed into ~64 partitions)
    assert point["files"] == 500 and point["partitions"] >= 500
    assert point["tasks_run"] == 200
    assert 0 < point["max_live_tasks"] <= 8  # a window for 2 one-thread workers
    assert 0 < point["driver_peak_rss_mb"] < 2048
