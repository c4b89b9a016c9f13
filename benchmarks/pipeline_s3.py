"""The pipeline writing to S3 against writing to local disk: same corpus, same workers.

Each run is ``python -m pipeline run`` in a fresh process (its own LocalCluster, its own S3
clients), output either to a local directory or to a bucket on a real S3 server on loopback
(SeaweedFS or MinIO, ``loopback_s3``); the two alternate, ``--runs`` times each. The
figure is the pipeline's own ``wall time`` line (cluster start to commit); the ratio
``s3_vs_local`` (local seconds / S3 seconds, medians) says what the object store costs. Every
S3 task reads and writes through the store: this is where a per-task client cost shows
(before 5c4b395 each Dask task built a new s3fs and S3 client: the 63 MB default took
42.7 s on S3, not 11.6 s).

Credentials reach the child through ``SHARDFLOW_STORAGE_OPTIONS``, never its command line.
JSON to benchmarks/results/pipeline_s3.json and a PNG plot; ``--quick`` is a smoke test.

    python benchmarks/pipeline_s3.py [--mb 60] [--runs 3] [--workers N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, ROOT, median, write_results  # noqa: E402
from benchmarks.pipeline_throughput import CORPUS_DIR, build_corpus  # noqa: E402
from loopback_s3 import start_servers  # noqa: E402

_WALL = re.compile(r"^wall time\s+([\d.]+) s", re.MULTILINE)
_TOKENS = re.compile(r"^tokens\s+([\d,]+)", re.MULTILINE)


def run_pipeline(files: list[Path], output: str, workers: int, options: dict | None) -> dict:
    """One ``python -m pipeline run`` into ``output``: its wall time and tokens."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if options is not None:
        env["SHARDFLOW_STORAGE_OPTIONS"] = json.dumps(options)
    cmd = [sys.executable, "-m", "pipeline", "run", *map(str, files), "--output", output,
           "--workers", str(workers), "--no-progress", "--dashboard-address", "127.0.0.1:0"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"pipeline into {output.split('@')[-1]} failed:\n{out.stderr[-3000:]}")
    wall, tokens = _WALL.search(out.stderr + out.stdout), _TOKENS.search(out.stderr + out.stdout)
    if wall is None or tokens is None:
        raise RuntimeError(f"no summary in the pipeline's output:\n{out.stderr[-2000:]}")
    return {"seconds": float(wall.group(1)), "process_s": round(time.perf_counter() - t0, 2),
            "tokens": int(tokens.group(1).replace(",", ""))}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["raw"])
    mids = [median([x["seconds"] for x in results["raw"][n]]) for n in names]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(names, mids, color=["#777", "#3a7"])
    for i, v in enumerate(mids):
        ax.text(i, v, f"{v:.1f} s", ha="center", va="bottom")
    ax.set_ylabel("pipeline wall time, s (median)")
    ax.set_title(f"{results['corpus_mb']:.0f} MB JSONL, {results['workers']} workers: "
                 f"S3 at {results['ratios']['s3_vs_local']:.2f}x local")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=60, help="corpus size in MB")
    ap.add_argument("--runs", type=int, default=3, help="runs per output (median)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="~5 MB, one run: a smoke test")
    args = ap.parse_args()
    mb, runs = (5, 1) if args.quick else (args.mb, args.runs)
    files, _ = build_corpus(mb << 20, CORPUS_DIR / f"{mb}mb")
    size = sum(f.stat().st_size for f in files)
    print(f"corpus: {len(files)} files, {size / 1e6:.0f} MB; {args.workers} workers")
    raw: dict[str, list[dict]] = {"local": [], "s3": []}
    (server,) = start_servers(1)
    try:
        for r in range(runs):
            local = Path(tempfile.mkdtemp(prefix="bench-s3-local-"))
            try:
                raw["local"].append(run_pipeline(files, str(local / "ds"), args.workers, None))
            finally:
                shutil.rmtree(local, ignore_errors=True)
            bucket = server.make_bucket(f"pipeline-{secrets.token_hex(4)}")
            raw["s3"].append(run_pipeline(files, f"{bucket.url}/ds", args.workers,
                                          bucket.storage_options))
            for name in raw:
                x = raw[name][-1]
                print(f"run {r + 1}/{runs} {name:5s} {x['seconds']:6.1f} s "
                      f"({x['tokens'] / x['seconds'] / 1e6:.2f} Mtok/s)", flush=True)
    finally:
        server.stop()
    assert raw["local"][0]["tokens"] == raw["s3"][0]["tokens"]
    seconds = {n: median([x["seconds"] for x in v]) for n, v in raw.items()}
    results = {
        "corpus_mb": size / 1e6, "workers": args.workers, "runs": runs, "quick": args.quick,
        "backend": server.backend, "raw": raw, "seconds": seconds,
        "ratios": {"s3_vs_local": seconds["local"] / seconds["s3"]},
        "note": "seconds = the pipeline's own wall time (cluster start to commit); "
                "s3_vs_local = local seconds / S3 seconds (1.0: S3 costs nothing extra)",
    }
    name = "pipeline_s3_quick" if args.quick else "pipeline_s3"
    path = write_results(name, results)
    plot(results, RESULTS / f"{name}.png")
    print(f"local {seconds['local']:.1f} s, S3 {seconds['s3']:.1f} s: S3 at "
          f"{results['ratios']['s3_vs_local']:.2f}x local; wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
