"""A reader's memory per shard it touches: the shards' own footers against footers made from
the index.

A reader that decodes under a shard's own Parquet footer fetches it once per process and
keeps it parsed for the process's life: ~1.8 KB per row group of every shard it has read from
(pyarrow's ``FileMetaData``), and with runs of row groups shuffled a rank touches nearly every
shard over an epoch. An index that records the shards' codecs (``shard_codec``) lets the
reader decode under a footer made from the index for just the row groups of one request
(:mod:`storage.format.chunk_footer`), dropped with it.

Measured: a local dataset of ``--shards`` shards of ``--groups-per-shard`` row groups, read by
a fresh process per run that reads one row group of every shard (the first read of each shard:
where its footer would be fetched and parsed), as a loader would; reported: the growth of the
process's anonymous resident memory (``RssAnon``: the heap, not the mapped shards' page cache)
and its CPU, with the index as written (footers made from it) and the same dataset with the
index's ``shard_codec`` column removed (what every dataset written before it is: the shards'
footers), interleaved, medians of ``--runs``. Extrapolated to row groups of 256 Ki tokens (the
benchmarks' loader datasets) at 10 B / 100 B / 1 T tokens, a rank touching every shard.

    python benchmarks/footer_memory.py          # ~1 minute
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, ROOT, median, write_results  # noqa: E402

VARIANTS = ("shard footers", "footers from the index")
SCALE_GROUP_TOKENS = 256 * 1024
CHILD = r"""
import json, sys, time
from loaders import reader as reader_module
from loaders.reader import TokenReader
from loaders.row_groups import RowGroupIndex
from storage import ReplicaSet, read_manifest

def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

# a local dataset this small keeps its shards' own footers (LOCAL_FOOTER_GROUPS); measured
# here: the two decodes, at any size
reader_module.LOCAL_FOOTER_GROUPS = 0
url = sys.argv[1]
store = ReplicaSet.from_urls([url])
index = RowGroupIndex.open(store, read_manifest(url))
reader = TokenReader(store, index)
first = index.first_group.tolist()
reader.fetch_groups([first[0]])  # warm: modules, the first mapping, pyarrow's pools
before, c0 = anon_kb(), time.process_time()
for s in range(1, len(first) - 1):
    reader.fetch_groups([first[s]])
cpu, after = time.process_time() - c0, anon_kb()
print(json.dumps({"anon_kb": after - before, "cpu_s": cpu, "shards": len(first) - 2,
                  "footers_read": reader.footers_read}))
"""


def build(root: Path, shards: int, groups: int, group_tokens: int) -> tuple[str, str]:
    """The dataset as written, and a copy whose index lacks ``shard_codec``."""
    from benchmarks.bench_utils import drop_shard_codecs, write_token_dataset
    from storage import ReplicaSet

    tokens = np.random.default_rng(0).integers(0, 50257, shards * groups * group_tokens,
                                               dtype=np.int64)
    new = root / "codecs"
    write_token_dataset(ReplicaSet.from_urls([str(new)]), tokens, shards,
                        row_group_tokens=group_tokens, doc_tokens=group_tokens // 2)
    old = root / "footers"
    store = ReplicaSet.from_urls([str(old)])
    for path in new.rglob("*"):
        if path.is_file():
            store.put(path.relative_to(new).as_posix(), path.read_bytes())
    drop_shard_codecs(old)
    return str(old), str(new)


def child(url: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, url], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    urls = dict(zip(VARIANTS, build(root, args.shards, args.groups_per_shard,
                                    args.row_group_tokens), strict=True))
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.runs):
        for v in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            runs[v].append(child(urls[v]))
    rows = []
    for v in VARIANTS:
        shards = runs[v][0]["shards"]
        kb = median([x["anon_kb"] for x in runs[v]])
        per_group = kb * 1024 / (shards * args.groups_per_shard)
        rows.append({"variant": v, "anon_mb": kb / 1024, "bytes_per_row_group": per_group,
                     "cpu_ms_per_shard": median([x["cpu_s"] for x in runs[v]]) / shards * 1e3,
                     "footers_read": runs[v][0]["footers_read"], "shards": shards,
                     "runs": runs[v],
                     "at_scale_gb": {f"{t:.0e}": per_group * t / SCALE_GROUP_TOKENS / 1e9
                                     for t in (1e10, 1e11, 1e12)}})
    return {"shards": args.shards, "groups_per_shard": args.groups_per_shard,
            "row_group_tokens": args.row_group_tokens, "rows": rows,
            "saved_bytes_per_row_group": (rows[0]["bytes_per_row_group"]
                                          - rows[1]["bytes_per_row_group"]),
            "first_read_cpu_ratio": rows[0]["cpu_ms_per_shard"] / rows[1]["cpu_ms_per_shard"]}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.bar([r["variant"] for r in rows], [r["anon_mb"] for r in rows], color=["grey", "C0"])
    for i, r in enumerate(rows):
        ax.annotate(f"{r['bytes_per_row_group']:,.0f} B/row group", (i, r["anon_mb"]),
                    ha="center", va="bottom")
    ax.set_ylabel("heap growth, MB (median)")
    ax.set_title(f"a reader after one row group of each of {rows[0]['shards']} shards\n"
                 f"({results['groups_per_shard']:,} row groups each)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=40)
    parser.add_argument("--groups-per-shard", type=int, default=2000)
    parser.add_argument("--row-group-tokens", type=int, default=256,
                        help="small row groups: many per shard at a small dataset")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(args, Path(tmp))
    for r in results["rows"]:
        scale = " / ".join(f"{gb:.2f}" for gb in r["at_scale_gb"].values())
        print(f"{r['variant']:24s} heap +{r['anon_mb']:7.1f} MB  "
              f"{r['bytes_per_row_group']:7.0f} B per row group  "
              f"{r['cpu_ms_per_shard']:6.2f} ms CPU per shard's first read  "
              f"footers read {r['footers_read']}  -> {scale} GB at 10 B / 100 B / 1 T tokens")
    print(f"footers from the index keep {results['saved_bytes_per_row_group']:,.0f} B per row "
          "group less than the shards' own; a shard's first read costs "
          f"{results['first_read_cpu_ratio']:.1f}x less CPU (no footer to parse)")
    path = write_results("footer_memory", results)
    plot(results, RESULTS / "footer_memory.png")
    print(f"results: {path} and {RESULTS / 'footer_memory.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
