"""The pipeline driver's memory for phase 2's results: ``ShardInfo`` objects against the
shard table (``pipeline/output/shard_table.py``: records on local disk, the index built there).

The driver needs every partition's shard record at the commit, in partition order, to write
the row-group index. Measured: a fresh process per run receives ``--partitions`` phase-2
results of ``--groups`` row groups each (what one partition of ``--groups`` x 256 Ki tokens
gives: 1,000 groups ~ a 1 GiB partition of text), one at a time as the job receives them,
then makes the index: held as ``work.PhaseTwo`` objects and the index built in memory (the
driver before its shard table) or folded into ``work.PhaseTwoResults`` and the index built in a
temporary file (now). Reported: the growth of the process's anonymous resident memory while
holding them (``RssAnon``), its peak while making the index (``VmHWM``, less the same
process's before), CPU, the temporary files' bytes, and the index's SHA-256 (equal for both:
the same bytes); interleaved, medians of ``--runs``; extrapolated per row group to 100 TB of
text (~90 M row groups of 256 Ki tokens). (The shard table of NumPy records in memory that
came between held ~51 bytes a row group and peaked at ~124: 4.6 / 11.2 GB at 100 TB.)

    python benchmarks/driver_shards.py            # ~1-2 minutes
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, ROOT, median, write_results  # noqa: E402

VARIANTS = ("ShardInfo objects (before)", "shard table on disk (now)")
#: row groups of 256 Ki tokens in 100 TB of text at ~4.2 bytes a token
GROUPS_100TB = 100e12 / 4.2 / (256 * 1024)
CHILD = r"""
import hashlib, json, sys, time
variant, parts, groups = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from pipeline.tasks import work
from storage import RowGroupInfo, ShardInfo
from storage.format.index import build_index

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

def hexd(*parts):
    return hashlib.sha256("-".join(map(str, parts)).encode()).hexdigest()

def shard(k):  # deterministic, so both variants write the same index
    return ShardInfo(f"shards/{k:08d}-{hexd(k)[:16]}.parquet", 127 * groups,
                     262_144 * groups, 400_000 * groups, hexd("s", k),
                     tuple(RowGroupInfo(127, 262_144, 4 + 400_000 * i, 400_000, hexd("g", k, i),
                                        hexd("b", k, i)) for i in range(groups)),
                     5_000, hexd("f", k), "ZSTD")

base, base_peak = status("RssAnon"), status("VmHWM")
t0 = time.process_time()
if variant == "objects":
    held = {}
    for k in range(parts):
        held[k] = work.PhaseTwo(k, shard(k))
    holding = status("RssAnon") - base
    data = build_index([held[k].shard for k in sorted(held)])
    size, sha, disk = len(data), hashlib.sha256(data).hexdigest(), 0
else:
    results = work.PhaseTwoResults()
    for k in range(parts):
        results.add(work.PhaseTwo(k, shard(k)))
    holding = status("RssAnon") - base
    disk = results.shards.disk_bytes  # the records' file, then the object's
    with results.shards.build_index() as built:
        size, sha = built.ref.bytes, built.ref.sha256
        disk += size
cpu = time.process_time() - t0
print(json.dumps({"holding_bytes": holding, "peak_bytes": status("VmHWM") - base_peak,
                  "cpu_s": cpu, "index_bytes": size, "index_sha256": sha, "disk_bytes": disk}))
"""


def run_one(variant: str, partitions: int, groups: int) -> dict[str, Any]:
    arg = "objects" if variant == VARIANTS[0] else "table"
    out = subprocess.run([sys.executable, "-c", CHILD, arg, str(partitions), str(groups)],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


#: the table again at this many times the row groups: its peak must not grow with them
SCALE = 4
RUNS = (*VARIANTS, f"{VARIANTS[1]}, x{SCALE} row groups")


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(results["variants"])
    held = [results["variants"][v]["holding_bytes"] / 1e6 for v in names]
    peak = [results["variants"][v]["peak_bytes"] / 1e6 for v in names]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], held, width=0.4, label="held until the index is made")
    ax.bar([i + 0.2 for i in x], peak, width=0.4, label="peak while making the index")
    ax.set_xticks(list(x), [n.replace(" (", "\n(").replace(", x", "\nx") for n in names],
                  fontsize=8)
    ax.set_ylabel("driver memory (MB)")
    ax.set_title(f"Phase 2's results in the driver ({results['row_groups']:,} row groups, "
                 f"then x{SCALE}): x{results['peak_ratio']:.1f} lower peak", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=200,
                        help="phase-2 results held (default 200)")
    parser.add_argument("--groups", type=int, default=1000,
                        help="row groups per partition (default 1000: ~a 1 GiB partition)")
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the JSON and PNG (default benchmarks/results)")
    args = parser.parse_args()
    parts = {RUNS[0]: args.partitions, RUNS[1]: args.partitions,
             RUNS[2]: args.partitions * SCALE}
    rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in RUNS}
    for r in range(args.runs):
        for v in RUNS if r % 2 == 0 else RUNS[::-1]:
            kind = VARIANTS[0] if v == RUNS[0] else VARIANTS[1]
            rounds[v].append(run_one(kind, parts[v], args.groups))
            last = rounds[v][-1]
            print(f"round {r + 1} {v:40s} held {last['holding_bytes'] / 1e6:8.1f} MB  peak "
                  f"{last['peak_bytes'] / 1e6:8.1f} MB  cpu {last['cpu_s']:.2f} s", flush=True)
    digests = {d["index_sha256"] for v in VARIANTS for d in rounds[v]}
    if len(digests) != 1:
        raise SystemExit(f"the variants wrote different indexes: {digests}")
    variants = {}
    for v in RUNS:
        n = parts[v] * args.groups
        held = median([d["holding_bytes"] for d in rounds[v]])
        peak = median([d["peak_bytes"] for d in rounds[v]])
        variants[v] = {"row_groups": n, "holding_bytes": held, "peak_bytes": peak,
                       "disk_bytes_per_group": median([d["disk_bytes"] for d in rounds[v]]) / n,
                       "cpu_s": median([d["cpu_s"] for d in rounds[v]]),
                       "holding_bytes_per_group": held / n, "peak_bytes_per_group": peak / n,
                       "rounds": rounds[v]}
    before, now, scaled = (variants[v] for v in RUNS)
    n = args.partitions * args.groups
    results = {"partitions": args.partitions, "groups_per_partition": args.groups,
               "row_groups": n, "runs": args.runs, "scale": SCALE, "variants": variants,
               "index_bytes": rounds[VARIANTS[0]][0]["index_bytes"],
               "objects_holding_gb_at_100tb": before["holding_bytes_per_group"]
               * GROUPS_100TB / 1e9,
               "objects_peak_gb_at_100tb": before["peak_bytes_per_group"] * GROUPS_100TB / 1e9,
               "holding_ratio": before["holding_bytes"] / max(1, now["holding_bytes"]),
               "peak_ratio": before["peak_bytes"] / max(1, now["peak_bytes"]),
               "table_peak_growth_at_scale": scaled["peak_bytes"] / max(1, now["peak_bytes"])}
    print(f"\n{n:,} row groups ({args.partitions} partitions x {args.groups}) and x{SCALE} for "
          f"the table, medians of {args.runs} interleaved rounds; the same index "
          f"({results['index_bytes']:,} bytes)")
    for v in RUNS:
        d = variants[v]
        print(f"  {v:40s} held {d['holding_bytes'] / 1e6:7.1f} MB "
              f"({d['holding_bytes_per_group']:5.1f} B/row group), peak "
              f"{d['peak_bytes'] / 1e6:7.1f} MB ({d['peak_bytes_per_group']:5.1f} B/row group), "
              f"cpu {d['cpu_s']:.2f} s, temporary files {d['disk_bytes_per_group']:.0f} B/row "
              "group")
    print(f"  objects at 100 TB: {results['objects_holding_gb_at_100tb']:.1f} GB held, "
          f"{results['objects_peak_gb_at_100tb']:.1f} GB peak; the table's peak at x{SCALE} the "
          f"row groups is x{results['table_peak_growth_at_scale']:.2f} its peak at x1")
    print(f"  held: {results['holding_ratio']:.0f}x less; peak: {results['peak_ratio']:.1f}x "
          "less (the table against the objects, same run)")
    if args.out is None:
        path, png = write_results("driver_shards", results), RESULTS / "driver_shards.png"
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        path, png = args.out / "driver_shards.json", args.out / "driver_shards.png"
        path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    plot(results, png)
    print(f"results: {path} and {png}")


if __name__ == "__main__":
    main()
