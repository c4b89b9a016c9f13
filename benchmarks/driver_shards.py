"""The pipeline driver's memory for phase 2's results: ``ShardInfo`` objects against the
compact shard table (``pipeline/shard_table.py``).

The driver holds every partition's shard record from phase 2 to the commit, because the
row-group index is written whole at the end. Measured: a fresh process per run holds
``--partitions`` phase-2 results of ``--groups`` row groups each (what one partition of
``--groups`` x 256 Ki tokens gives: 1,000 groups ~ a 1 GiB partition of text), arriving one at
a time as the job receives them, then writes the index: held as ``work.PhaseTwo`` objects
(the driver before) or folded into ``work.PhaseTwoResults`` (now). Reported: the growth of the
process's anonymous resident memory while holding them (``RssAnon``), its peak while writing
the index (``VmHWM``, less the same process's before), CPU, and the index's SHA-256 (equal
for both: the same bytes); interleaved, medians of ``--runs``; extrapolated per row group to
100 TB of text (~90 M row groups of 256 Ki tokens).

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

VARIANTS = ("ShardInfo objects (before)", "shard table (now)")
#: row groups of 256 Ki tokens in 100 TB of text at ~4.2 bytes a token
GROUPS_100TB = 100e12 / 4.2 / (256 * 1024)
CHILD = r"""
import hashlib, json, sys, time
variant, parts, groups = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from pipeline import work
from storage import RowGroupInfo, ShardInfo
from storage.format.index import build_index, build_index_arrays

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
else:
    results = work.PhaseTwoResults()
    for k in range(parts):
        results.add(work.PhaseTwo(k, shard(k)))
    holding = status("RssAnon") - base
    data = build_index_arrays(results.shards.columns())
cpu = time.process_time() - t0
print(json.dumps({"holding_bytes": holding, "peak_bytes": status("VmHWM") - base_peak,
                  "cpu_s": cpu, "index_bytes": len(data),
                  "index_sha256": hashlib.sha256(data).hexdigest()}))
"""


def run_one(variant: str, partitions: int, groups: int) -> dict[str, Any]:
    arg = "objects" if variant == VARIANTS[0] else "table"
    out = subprocess.run([sys.executable, "-c", CHILD, arg, str(partitions), str(groups)],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    names = list(results["variants"])
    per_group = [results["variants"][v]["holding_bytes_per_group"] for v in names]
    peak = [results["variants"][v]["peak_bytes_per_group"] for v in names]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], per_group, width=0.4, label="held until the index is written")
    ax.bar([i + 0.2 for i in x], peak, width=0.4, label="peak while writing the index")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("driver bytes per row group")
    ax.set_title(f"Phase 2's results in the driver ({results['row_groups']:,} row groups; "
                 f"x{results['holding_ratio']:.1f} less held)", fontsize=9)
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
    rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.runs):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            rounds[v].append(run_one(v, args.partitions, args.groups))
            last = rounds[v][-1]
            print(f"round {r + 1} {v:28s} held {last['holding_bytes'] / 1e6:8.1f} MB  peak "
                  f"{last['peak_bytes'] / 1e6:8.1f} MB  cpu {last['cpu_s']:.2f} s", flush=True)
    digests = {d["index_sha256"] for v in VARIANTS for d in rounds[v]}
    if len(digests) != 1:
        raise SystemExit(f"the variants wrote different indexes: {digests}")
    n = args.partitions * args.groups
    variants = {}
    for v in VARIANTS:
        held = median([d["holding_bytes"] for d in rounds[v]])
        peak = median([d["peak_bytes"] for d in rounds[v]])
        variants[v] = {"holding_bytes": held, "peak_bytes": peak,
                       "cpu_s": median([d["cpu_s"] for d in rounds[v]]),
                       "holding_bytes_per_group": held / n, "peak_bytes_per_group": peak / n,
                       "holding_gb_at_100tb": held / n * GROUPS_100TB / 1e9,
                       "peak_gb_at_100tb": peak / n * GROUPS_100TB / 1e9, "rounds": rounds[v]}
    before, now = (variants[v] for v in VARIANTS)
    results = {"partitions": args.partitions, "groups_per_partition": args.groups,
               "row_groups": n, "runs": args.runs, "variants": variants,
               "index_bytes": rounds[VARIANTS[0]][0]["index_bytes"],
               "holding_ratio": before["holding_bytes"] / max(1, now["holding_bytes"]),
               "peak_ratio": before["peak_bytes"] / max(1, now["peak_bytes"])}
    print(f"\n{n:,} row groups ({args.partitions} partitions x {args.groups}), medians of "
          f"{args.runs} interleaved rounds; the same index ({results['index_bytes']:,} bytes)")
    for v in VARIANTS:
        d = variants[v]
        print(f"  {v:28s} {d['holding_bytes_per_group']:6.0f} B/row group held "
              f"({d['holding_gb_at_100tb']:5.1f} GB at 100 TB), peak "
              f"{d['peak_bytes_per_group']:6.0f} B/row group ({d['peak_gb_at_100tb']:5.1f} GB), "
              f"cpu {d['cpu_s']:.2f} s")
    print(f"  held: {results['holding_ratio']:.1f}x less; peak: {results['peak_ratio']:.1f}x "
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
