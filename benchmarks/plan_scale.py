"""What one rank pays to start (and to resume) at trillion-token scale: build time, peak RSS.

A synthetic ``shardflow.dataset/2`` dataset (a binary row-group index, :mod:`storage.format.index`,
and the manifest naming it; no shard data) of ``--row-groups`` row groups of ~256 Ki tokens
(262,144 plus up to 4,000: the overshoot of the document that closes a row group), 16 per
shard, goes through the loader's own code path:

    loaders.source.DatasetSource: read manifest.json (a few KB) -> the index's ``tokens`` and
    ``first_group`` columns (ranged reads, checksummed; loaders.row_groups.RowGroupIndex.open)
    -> GroupPlan -> lane_plan(this rank's lanes) -> loaders.source.rank_stream -> the first
    batch (the stream generates the first chunk of global steps only, from the progress on)

for rank ``--rank`` of ``--world`` (per-rank batch 8 samples of 2048 tokens, one lane per
sample of the global batch, the loader's defaults). ``build_s`` is that, from a cold process
with the imports done; ``resume_same_s`` the same from a mid-epoch state on the same world
size, ``resume_other_s`` on half the world size (per-rank batch doubled: the same global
batch); ``peak_rss_mb`` the process's peak RSS (VmHWM) and ``extra_rss_mb`` its growth over
the RSS after imports (everything resident: the pages of the host's shared index copy that
this process touched count in full); ``private_mb``: the peak growth of its private memory
(RssAnon, sampled every millisecond); ``shared_file_mb``: pages of the shared copy resident
in it after its first batch. Each point runs in a fresh process:

    python benchmarks/plan_scale.py --row-groups 1000000 --world 10000 --rank 9999 --json
    python benchmarks/plan_scale.py             # the sweep: 1 M and 10 M row groups,
                                                # world 8 .. 16,384, middle rank, medians of 3
    python benchmarks/plan_scale.py --ranks-on-host 8   # 8 ranks of one node at once

The middle rank (W/2) is measured: a rank scans the permuted sizes from the nearer end of the
epoch, so the ranks in the middle scan the most (half of them; ranks 0 and W-1 only their
own 1/W).

``--ranks-on-host N`` starts N ranks together (ranks W/2 - N/2 ..) with the index copy private
per rank (built in process memory, as below ``MIN_INDEX_BYTES``) and shared (the host's copy
written by the first, cold; then already there, warm) and reports per rank, measured from
``/proc`` while all N are alive after their first batch: ``private_mb`` (peak RssAnon growth),
``index_pss_mb`` (its proportional share of the pages of the shared copy mapped: a page
mapped by k processes counts 1/k in each) and ``per_rank_mb`` = the two added: what one more
rank costs the host. RSS (which counts every shared page in every process) is reported
beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEQ = 2048
BATCH = 8
GROUPS_PER_SHARD = 16
INDEX_DIR = Path(tempfile.gettempdir()) / "shardflow-plan-scale"
WORLDS = (8, 64, 1024, 10_000, 16_384)
SIZES = (1_000_000, 10_000_000)


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _index_pss_mb() -> float:
    """This process's proportional share of the shared index copies it maps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line
                inside = "shardflow-index-" in line
            elif inside and head == "Pss:":
                total += int(line.split()[1])
    return total / 1024


class AnonPeak:
    """Peak RssAnon (private memory) of this process, sampled every millisecond."""

    def __init__(self) -> None:
        self.base = self.peak = _status_mb("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _status_mb("RssAnon"))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status_mb("RssAnon"))
        return self.peak - self.base


def make_index(n_groups: int, path: Path) -> None:
    """Write a synthetic index of ``n_groups`` row groups (deterministic)."""
    from storage.format.index import build_index_arrays

    rng = np.random.default_rng(n_groups)
    n_shards = -(-n_groups // GROUPS_PER_SHARD)
    tokens = (262_144 + rng.integers(0, 4000, n_groups)).astype(np.uint32)
    per_shard = np.full(n_shards, GROUPS_PER_SHARD, dtype=np.uint64)
    per_shard[-1] = n_groups - GROUPS_PER_SHARD * (n_shards - 1)
    first = np.concatenate([[0], np.cumsum(per_shard)]).astype(np.uint64)
    length = (tokens.astype(np.uint64) * 2 // 3).astype(np.uint32)  # ~zstd'd uint16
    in_shard = np.arange(n_groups) - np.repeat(first[:-1].astype(np.int64),
                                               per_shard.astype(np.int64))
    offset = (4 + in_shard.astype(np.uint64) * 180_000).astype(np.uint64)
    paths = [f"shards/part-{i:07d}.parquet".encode() for i in range(n_shards)]
    columns = {
        "rows": rng.integers(50, 500, n_groups).astype(np.uint32),
        "tokens": tokens, "offset": offset, "length": length,
        "digest": np.frombuffer(rng.bytes(16 * n_groups), dtype="V16"),
        "first_group": first,
        "shard_rows": np.full(n_shards, 4000, dtype=np.uint64),
        "shard_tokens": np.add.reduceat(tokens.astype(np.uint64), first[:-1].astype(np.int64)),
        "shard_bytes": np.full(n_shards, 3_000_000, dtype=np.uint64),
        "shard_sha256": np.frombuffer(rng.bytes(32 * n_shards), dtype="V32"),
        "footer_length": np.full(n_shards, 2000, dtype=np.uint64),
        "footer_sha256": np.frombuffer(rng.bytes(32 * n_shards), dtype="V32"),
        "path_end": np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.uint64),
        "paths": np.frombuffer(b"".join(paths), dtype=np.uint8),
    }
    data = build_index_arrays(columns)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_manifest_for(index_file: Path, root: Path) -> Any:
    """Make ``root`` a v2 dataset around the index at ``index_file`` (moved to its
    content-addressed name); the manifest's totals come from the index."""
    from storage import Manifest, TokenizerInfo, Totals, index_name, resolve, write_manifest
    from storage.format.index import index_ref, read_index

    data = index_file.read_bytes()
    ref = index_ref(index_name(hashlib.sha256(data).hexdigest()), data)
    cols = read_index(data)
    totals = Totals(len(cols["shard_rows"]), len(cols["rows"]),
                    int(cols["rows"].sum(dtype=np.uint64)),
                    int(cols["tokens"].sum(dtype=np.uint64)),
                    int(cols["shard_bytes"].sum(dtype=np.uint64)))
    del cols, data
    (root / "index").mkdir(parents=True, exist_ok=True)
    os.replace(index_file, root / ref.path)
    tok = TokenizerInfo("synthetic", "tokenizer-0000000000000000.json", "0" * 64, 50257, 50256,
                        "<|endoftext|>")
    manifest = Manifest(tok, (), {"doc_id": "string", "input_ids": "binary<uint16le>"},
                        index=ref, totals=totals)
    write_manifest(resolve(str(root)), manifest)
    return manifest


def index_path(n_groups: int) -> Path:
    """The synthetic dataset's directory (made once, in a child process: building it must
    not count in a measured process's peak RSS)."""
    path = INDEX_DIR / f"dataset-{n_groups}"
    if not (path / "manifest.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, __file__, "--make-index", str(n_groups), str(path)],
                       check=True)
    return path


def measure(path: Path, world: int, rank: int) -> dict[str, Any]:
    """One point, in this (fresh) process."""
    from loaders.plan import Layout, Progress
    from loaders.settings import LoaderSettings
    from loaders.source import DatasetSource, rank_stream

    settings = LoaderSettings(SEQ)
    base_rss, base_file = _status_mb("VmRSS"), _status_mb("RssFile")
    anon = AnonPeak()

    def first_batch(world_: int, rank_: int, batch: int, progress: Progress
                    ) -> tuple[np.ndarray, int]:
        source = DatasetSource(str(path), settings)  # what TokenDataset opens
        layout = Layout(world * BATCH, 1, world_, rank_, batch)
        first = next(rank_stream(source, layout, progress).batches())
        # pages of the host's shared copy resident here while the source is alive (the first,
        # kept alive to the end, as a job keeps its loader: its mappings count at --hold too)
        if not kept:
            kept.append(source)
            shared["mb"] = _status_mb("RssFile") - base_file
        return first, source.lane_length(layout.lanes)

    shared: dict[str, float] = {}
    kept: list[DatasetSource] = []

    t0 = time.perf_counter()
    batch0, lane_len = first_batch(world, rank, BATCH, Progress())
    build_s = time.perf_counter() - t0
    assert len(batch0) == BATCH
    # A state taken half-way through the epoch (the same on every rank).
    half = Progress(0, lane_pos=lane_len // 2)
    t0 = time.perf_counter()
    first_batch(world, rank, BATCH, half)
    resume_same_s = time.perf_counter() - t0
    other = max(1, world // 2)
    t0 = time.perf_counter()
    first_batch(other, rank // 2 if world > 1 else 0, BATCH * world // other, half)
    resume_other_s = time.perf_counter() - t0
    private = anon.stop()
    return {"row_groups": int(path.name.split("-")[1]), "world": world, "rank": rank,
            "build_s": build_s, "resume_same_s": resume_same_s,
            "resume_other_s": resume_other_s, "other_world": other,
            "peak_rss_mb": _status_mb("VmHWM"), "extra_rss_mb": _status_mb("VmHWM") - base_rss,
            "private_mb": private, "shared_file_mb": shared["mb"], "_kept": kept,
            "samples_per_rank": int(lane_len) * BATCH}


def _pss_mb() -> float:
    """This process's proportional set size: shared pages count 1/(processes mapping them)."""
    with open("/proc/self/smaps_rollup") as fh:
        for line in fh:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _node(n_groups: int, world: int, ranks: int, env: dict[str, str],
          private: bool) -> list[dict[str, Any]]:
    """``ranks`` ranks started together; measured once all have their first batch."""
    path = index_path(n_groups)
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--row-groups", str(n_groups), "--world", str(world),
         "--rank", str(world // 2 - ranks // 2 + r), "--json", "--index", str(path), "--hold",
         *(["--private"] if private else [])],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for r in range(ranks)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "READY"
    out = []
    for p in procs:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write("\n")
        p.stdin.flush()
        out.append(json.loads(p.stdout.readline()))
        p.wait()
    return out


def ranks_on_host(n_groups: int, world: int, ranks: int) -> int:
    """What a node of ``ranks`` ranks holds, index private per rank vs shared."""
    from benchmarks.bench_utils import write_results

    index_path(n_groups)
    share_dir = tempfile.mkdtemp(prefix="shardflow-index-bench-")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "SHARDFLOW_INDEX_DIR": share_dir}
    modes = {}
    try:
        for mode, private in (("private", True), ("shared_cold", False),
                              ("shared_warm", False)):
            got = _node(n_groups, world, ranks, env, private)
            for g in got:
                g["per_rank_mb"] = g["private_mb"] + g["index_pss_mb"]
            per_rank = [g["per_rank_mb"] for g in got]
            modes[mode] = {
                "ranks": got, "sum_pss_mb": sum(g["pss_mb"] for g in got),
                "sum_rss_mb": sum(g["rss_mb"] for g in got),
                "median_build_s": float(np.median([g["build_s"] for g in got])),
                "max_build_s": max(g["build_s"] for g in got),
                "median_per_rank_mb": float(np.median(per_rank)),
                "max_per_rank_mb": max(per_rank),
                "median_private_mb": float(np.median([g["private_mb"] for g in got])),
                "max_private_mb": max(g["private_mb"] for g in got),
                "sum_index_pss_mb": sum(g["index_pss_mb"] for g in got),
                "median_extra_rss_mb": float(np.median([g["extra_rss_mb"] for g in got]))}
            m = modes[mode]
            print(f"{mode:12} {ranks} ranks: per rank (private peak + share of the shared "
                  f"copy) {m['median_per_rank_mb']:6.1f} MB (max {m['max_per_rank_mb']:6.1f}; "
                  f"private {m['median_private_mb']:.1f}, max {m['max_private_mb']:.1f}; "
                  f"shared copy {m['sum_index_pss_mb']:.0f} MB resident in all); RSS growth "
                  f"{m['median_extra_rss_mb']:6.1f} MB; first batch {m['median_build_s']:.2f} s "
                  f"(slowest {m['max_build_s']:.2f} s)", flush=True)
    finally:
        import shutil

        shutil.rmtree(share_dir, ignore_errors=True)
    path = write_results("plan_scale_node", {"row_groups": n_groups, "world": world,
                                             "ranks_on_host": ranks, "modes": modes})
    print(f"results: {path}")
    return 0


def point(n_groups: int, world: int, rank: int) -> dict[str, Any]:
    path = index_path(n_groups)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--row-groups", str(n_groups), "--world",
                          str(world), "--rank", str(rank), "--json", "--index", str(path)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for n in sorted({r["row_groups"] for r in rows}):
        mine = sorted((r for r in rows if r["row_groups"] == n), key=lambda r: r["world"])
        w = [r["world"] for r in mine]
        label = f"{n / 1e6:g} M row groups"
        ax1.plot(w, [r["build_s"] for r in mine], "o-", label=f"{label}: first batch")
        ax1.plot(w, [r["resume_other_s"] for r in mine], "x--", label=f"{label}: resume, W/2")
        ax2.plot(w, [r["extra_rss_mb"] for r in mine], "o-", label=f"{label}: RSS growth")
        ax2.plot(w, [max(0.1, r.get("private_mb", 0.0)) for r in mine], "x--",
                 label=f"{label}: private (RssAnon) peak")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("world size (middle rank measured: the longest scan)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.axhline(5.0, color="grey", lw=0.8, ls=":")
    ax1.set_ylabel("seconds (median of 3)")
    ax1.set_title("one rank's plan: cold start to the first batch")
    ax2.axhline(100, color="grey", lw=0.8)
    ax2.set_yscale("log")
    ax2.set_ylabel("MB over the imports")
    ax2.set_title("one rank's memory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--row-groups", type=int)
    parser.add_argument("--world", type=int)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--json", action="store_true", help="one point, one JSON object")
    parser.add_argument("--index", type=Path,
                        help="a synthetic dataset (index + manifest) already written")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks-on-host", type=int, metavar="N",
                        help="N ranks of one node at once (--row-groups, --world), with the "
                             "index private per rank and shared (loaders.shared_index, cold "
                             "and warm): each rank's RSS and PSS (its share of shared pages)")
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--private", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--make-index", nargs=2, metavar=("N", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_index:
        root = Path(args.make_index[1])
        make_index(int(args.make_index[0]), root / "synthetic.sfidx")
        write_manifest_for(root / "synthetic.sfidx", root)
        return 0
    if args.ranks_on_host and not args.hold:
        return ranks_on_host(args.row_groups or SIZES[1], args.world or 10_000,
                             args.ranks_on_host)
    if args.world is not None:
        n = args.row_groups or SIZES[0]
        rank = args.world // 2 if args.rank is None else args.rank
        if args.index is None:  # measure in a fresh child, never next to the index build
            print(json.dumps(point(n, args.world, rank)))
            return 0
        if args.private:
            import loaders.shared_index

            loaders.shared_index.MIN_INDEX_BYTES = 1 << 62
        result = measure(args.index, args.world, rank)
        alive = result.pop("_kept")  # the rank's source, alive while measured below
        if args.hold:  # measured while the other ranks of the node are alive too
            print("READY", flush=True)
            sys.stdin.readline()
            result["rss_mb"], result["pss_mb"] = _status_mb("VmRSS"), _pss_mb()
            result["index_pss_mb"] = _index_pss_mb()
        print(json.dumps(result) if args.json else result)
        del alive
        return 0
    from benchmarks.bench_utils import RESULTS, median, write_results

    rows = []
    sizes = (args.row_groups,) if args.row_groups else SIZES
    print(f"{'row groups':>10} {'world':>6} {'build s':>8} {'resume s':>9} {'resume W/2':>10} "
          f"{'peak MB':>8} {'extra MB':>8} {'private':>8} {'shared':>7}")
    for n in sizes:
        for world in WORLDS:
            runs = [point(n, world, world // 2) for _ in range(args.runs)]
            row = {k: median([r[k] for r in runs]) if isinstance(runs[0][k], float)
                   else runs[0][k] for k in runs[0]}
            rows.append(row)
            print(f"{n:10d} {world:6d} {row['build_s']:8.3f} {row['resume_same_s']:9.3f} "
                  f"{row['resume_other_s']:10.3f} {row['peak_rss_mb']:8.1f} "
                  f"{row['extra_rss_mb']:8.1f} {row['private_mb']:8.1f} "
                  f"{row['shared_file_mb']:7.1f}", flush=True)
    write_results("plan_scale", {"seq_len": SEQ, "batch_per_rank": BATCH, "runs": args.runs,
                                 "points": rows})
    plot(rows, RESULTS / "plan_scale.png")
    print(f"results: {RESULTS / 'plan_scale.json'} and {RESULTS / 'plan_scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
