"""What lineage costs a run: the bytes of its drop records against the shards', and the CPU of
its pieces against the run's.

The claim (README, "Where a document came from"): on the demo corpus the drop records are
under 1 % of the shards' bytes, the manifest stays a few KB (the records are named by one
list), and the lineage's own work (encoding the records, hashing the input listing, reading the
git commit) is tens of milliseconds of a run of seconds.

One invocation runs the pipeline on the embedded demo (in-process, one worker, no card) and
reads back what lineage wrote: the records, their list and the manifest, beside the shards
(the baseline, from the same run). Then ``--runs`` times, each piece again: every record's
lines encoded as the run encoded them, the listing hash of the demo's inputs, the git commit
read from the checkout. Figures are medians. Results: ``benchmarks/results/lineage_cost.json``
and ``lineage_cost.png``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, ROOT, machine, median, timed, write_results


def build(out: Path) -> dict[str, Any]:
    """The demo dataset, and the run's own wall and CPU time (the driver's process)."""
    from pipeline.config import PipelineConfig
    from pipeline.driver.job import run

    t0, cpu0 = time.perf_counter(), time.process_time()
    summary = run(PipelineConfig(output=str(out), workers=1, card=False,
                                 dashboard_address="127.0.0.1:0"), progress=False)
    return {"wall_s": time.perf_counter() - t0, "driver_cpu_s": time.process_time() - cpu0,
            "documents": summary.docs_in, "partitions": summary.partitions}


def sizes(out: Path) -> dict[str, Any]:
    from storage import read_manifest
    from storage.io.index_store import drop_records_of

    m = read_manifest(str(out))
    records = drop_records_of(str(out), m)
    shards = sum(p.stat().st_size for p in (out / "shards").iterdir())
    record_bytes = sum(r.bytes for r in records)
    dropped = sum(m.stats["dropped"].values())
    return {"shards_bytes": shards, "records": len(records), "record_bytes": record_bytes,
            "list_bytes": m.drops.bytes if m.drops else 0,
            "manifest_bytes": (out / "manifest.json").stat().st_size,
            "documents_dropped": dropped,
            "bytes_per_dropped_document": record_bytes / dropped if dropped else 0.0,
            "records_vs_shards": record_bytes / shards}


def pieces(out: Path) -> dict[str, float]:
    """Seconds of each piece of the lineage's work, done again on this run's data."""
    from pipeline.lineage import provenance, records
    from pipeline.lineage.code_version import git_commit
    from pipeline.planning.discovery import default_corpus, discover_table
    from storage import read_manifest
    from storage.io.index_store import drop_records_of

    m = read_manifest(str(out))
    lines = [list(records.decode((out / r.path).read_bytes(), r.path))
             for r in drop_records_of(str(out), m)]
    files = discover_table(default_corpus())
    encode_s, _ = timed(lambda: [records.encode(x) for x in lines])
    listing_s, _ = timed(lambda: provenance.listing_sha256(files))
    commit_s, _ = timed(lambda: git_commit(ROOT))
    return {"encode_records_s": encode_s, "listing_sha256_s": listing_s, "git_commit_s": commit_s,
            "total_s": encode_s + listing_s + commit_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="times each piece is measured")
    parser.add_argument("--quick", action="store_true", help="each piece timed once")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.runs = 1
    root = Path(args.workdir or tempfile.mkdtemp(prefix="lineage-cost-"))
    out = root / "demo"
    shutil.rmtree(out, ignore_errors=True)
    run = build(out)
    size = sizes(out)
    measured = [pieces(out) for _ in range(args.runs)]
    cost = {k: median([x[k] for x in measured]) for k in measured[0]}
    # against the run's wall time: the records are encoded in the workers, whose CPU the
    # driver's process does not see
    cost["share_of_run_wall"] = cost["total_s"] / run["wall_s"]
    print(f"demo: {run['documents']:,} documents, {run['partitions']} partitions, "
          f"{size['documents_dropped']:,} left out; run {run['wall_s']:.1f} s "
          f"({run['driver_cpu_s']:.2f} s driver CPU)")
    print(f"  bytes    drop records {size['record_bytes']:,} in {size['records']} "
          f"({size['bytes_per_dropped_document']:.1f} a document left out; "
          f"{size['records_vs_shards']:.2%} of the shards' {size['shards_bytes']:,}); their "
          f"list {size['list_bytes']:,}; manifest {size['manifest_bytes']:,}")
    print(f"  CPU      medians of {args.runs}: encode the records "
          f"{cost['encode_records_s'] * 1e3:.1f} ms, listing hash "
          f"{cost['listing_sha256_s'] * 1e3:.2f} ms, git commit {cost['git_commit_s'] * 1e3:.2f} "
          f"ms: {cost['total_s'] * 1e3:.1f} ms, {cost['share_of_run_wall']:.2%} of the run's "
          "wall time")
    results = {"run": run, "sizes": size, "pieces": measured, "cost": cost,
               "runs": args.runs, "machine": machine()}
    name = "lineage_cost_quick" if args.quick else "lineage_cost"
    path = write_results(name, results)
    plot(size, cost, RESULTS / f"{name}.png")
    print(f"wrote {path}")
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def plot(size: dict[str, Any], cost: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["shards", "drop records", "their list", "manifest"]
    values = [size["shards_bytes"], size["record_bytes"], size["list_bytes"],
              size["manifest_bytes"]]
    a.bar(names, [v / 1e3 for v in values], color=["#4c72b0", "#dd8452", "#dd8452", "#55a868"])
    a.set_yscale("log")
    a.set_ylabel("KB (log scale)")
    a.set_title(f"drop records {size['records_vs_shards']:.2%} of the shards' bytes")
    parts = ["encode_records_s", "listing_sha256_s", "git_commit_s"]
    b.bar(["encode records", "listing hash", "git commit"], [cost[k] * 1e3 for k in parts],
          color="#dd8452")
    b.set_ylabel("ms (median)")
    b.set_title(f"lineage work {cost['total_s'] * 1e3:.1f} ms, "
                f"{cost['share_of_run_wall']:.2%} of the run's wall time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
