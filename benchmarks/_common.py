"""Shared benchmark helpers: medians, timing in clean subprocesses, results files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def run_child(args: list[str], threads: int) -> dict[str, Any]:
    """Run ``python <script> args`` with ``threads`` tokenizer threads; its last stdout line
    is a JSON object. A fresh process per measurement: rayon's pool is sized once per process."""
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false",
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                         cwd=ROOT, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path
