"""Row-group reads through ``storage`` vs raw s3fs, and the time a reader loses to a dead replica.

Everything runs against real S3 servers on loopback (MinIO or SeaweedFS, started here):

1. Throughput: every row group of a dataset read and decoded to token arrays, once through
   Shardflow's reader (replica set, one ranged GET per row group, sha256 verified) and once
   the usual way with raw s3fs (``ParquetFile(fs.open(path)).read_row_group``), one thread
   each, alternating, medians over ``--runs``. Aim: Shardflow >= 0.8x raw.
2. Failover: the loader iterates a dataset stored on two servers; the preferred server is
   SIGKILLed a quarter of the way through. Time lost = disturbed run - undisturbed run
   (medians). Aim: < 2 s.

    python benchmarks/storage_read.py            # full run
    python benchmarks/storage_read.py --quick    # smoke test, well under a minute
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import (  # noqa: E402
    RESULTS,
    median,
    shakespeare_tokens,
    write_results,
    write_token_dataset,
)
from loaders import build_dataloader  # noqa: E402
from loaders.reader import RowGroupIndex, TokenReader  # noqa: E402
from storage import ReplicaSet, resolve  # noqa: E402
from storage.testing import start_servers  # noqa: E402


def read_shardflow(url: str, options: dict) -> tuple[int, int]:
    store = ReplicaSet.from_urls([url], options)
    manifest = store.read_manifest()
    reader = TokenReader(store, RowGroupIndex(manifest))
    tokens = 0
    for shard in range(len(manifest.shards)):
        groups = [int(g) for g in np.flatnonzero(reader.index.shard_of == shard)]
        tokens += sum(len(a) for a in reader.fetch_groups(groups).values())
    return tokens, reader.bytes_read


def read_raw(url: str, options: dict, manifest) -> tuple[int, int]:
    loc = resolve(url, options)
    tokens = nbytes = 0
    for shard in manifest.shards:
        with loc.fs.open(loc.path(shard.path), "rb") as fh:
            pf = pq.ParquetFile(fh)
            for i in range(pf.num_row_groups):
                table = pf.read_row_group(i, columns=["input_ids"], use_threads=False)
                arr = table.column(0).combine_chunks().flatten().to_numpy(zero_copy_only=False)
                tokens += len(arr)
                nbytes += pf.metadata.row_group(i).column(1).total_compressed_size
    return tokens, nbytes


def throughput(tokens: np.ndarray, runs: int, shards: int) -> dict:
    (server,) = start_servers(1)
    try:
        bucket = server.make_bucket("bench-read")
        url = f"{bucket.url}/ds"
        store = ReplicaSet.from_urls([url], bucket.storage_options)
        manifest = write_token_dataset(store, tokens, shards)
        times: dict[str, list[float]] = {"shardflow": [], "raw_s3fs": []}
        read_bytes = 0
        for run in range(runs):
            order = ["shardflow", "raw_s3fs"] if run % 2 == 0 else ["raw_s3fs", "shardflow"]
            for name in order:
                t0 = time.perf_counter()
                if name == "shardflow":
                    n, read_bytes = read_shardflow(url, bucket.storage_options)
                else:
                    n, _ = read_raw(url, bucket.storage_options, manifest)
                times[name].append(time.perf_counter() - t0)
                assert n == manifest.total_tokens, (name, n, manifest.total_tokens)
        med = {k: median(v) for k, v in times.items()}
        return {
            "backend": server.backend, "tokens": manifest.total_tokens,
            "row_groups": sum(len(s.row_groups) for s in manifest.shards),
            "compressed_bytes": read_bytes, "runs": runs, "seconds": times,
            "median_s": med,
            "mtok_per_s": {k: manifest.total_tokens / v / 1e6 for k, v in med.items()},
            "ratio_shardflow_vs_raw": med["raw_s3fs"] / med["shardflow"],
        }
    finally:
        server.stop()


def _iterate(url: str, replicas: list[str], options: list[dict],
             kill_at: int | None, kill) -> tuple[float, list[float], int]:
    loader = build_dataloader(url, 8, 2048, rank=0, world_size=1, replicas=replicas,
                              replica_options=options, return_sample_id=True)
    stamps = []
    t0 = time.perf_counter()
    ids = []
    for i, batch in enumerate(loader):
        if kill_at is not None and i == kill_at:
            kill()
        ids.append(int(batch["sample_id"][0]))
        stamps.append(time.perf_counter() - t0)
    return time.perf_counter() - t0, stamps, loader.dataset.store.failovers


def failover(tokens: np.ndarray, runs: int, shards: int) -> dict:
    clean, disturbed, timelines, failovers = [], [], {}, []
    for run in range(runs):
        servers = start_servers(2)
        try:
            buckets = [s.make_bucket("bench-failover") for s in servers]
            urls = [f"{b.url}/ds" for b in buckets]
            opts = [b.storage_options for b in buckets]
            write_token_dataset(ReplicaSet.from_urls(urls, replica_options=opts), tokens, shards)
            total, stamps, _ = _iterate(urls[0], urls[1:], opts, None, None)
            clean.append(total)
            kill_at = len(stamps) // 4
            total, stamps_k, n_fail = _iterate(urls[0], urls[1:], opts, kill_at, servers[0].kill)
            disturbed.append(total)
            failovers.append(n_fail)
            if run == 0:
                timelines = {"clean": stamps, "disturbed": stamps_k, "kill_at_batch": kill_at}
        finally:
            for s in servers:
                s.stop()
    lost = [d - c for d, c in zip(disturbed, clean, strict=True)]
    return {"runs": runs, "clean_s": clean, "disturbed_s": disturbed, "lost_s": lost,
            "median_lost_s": median(lost), "failovers": failovers, "timeline": timelines}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    tp = results["throughput"]["mtok_per_s"]
    ax1.bar(list(tp), list(tp.values()), color=["tab:blue", "tab:gray"])
    ax1.set_ylabel("Mtokens/s (read + decode, 1 thread)")
    ax1.set_title(f"row-group reads from S3: ratio "
                  f"{results['throughput']['ratio_shardflow_vs_raw']:.2f}x raw")
    tl = results["failover"]["timeline"]
    ax2.plot(tl["clean"], label="undisturbed")
    ax2.plot(tl["disturbed"], label="preferred replica SIGKILLed")
    ax2.axvline(tl["kill_at_batch"], color="red", linestyle=":", label="kill")
    ax2.set_xlabel("batch")
    ax2.set_ylabel("elapsed s")
    ax2.set_title(f"failover: median time lost {results['failover']['median_lost_s']:.2f} s")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=30e6, help="tokens in the dataset")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small and few runs (smoke test)")
    args = parser.parse_args()
    n_tokens, runs, failover_runs = int(args.tokens), args.runs, 3
    if args.quick:
        n_tokens, runs, failover_runs = 3_000_000, 2, 1
    base = shakespeare_tokens()
    tokens = np.resize(base, n_tokens)
    shards = max(2, n_tokens // 4_000_000)
    print(f"dataset: {n_tokens / 1e6:.1f} M tokens of Shakespeare (GPT-2 BPE), {shards} shards")
    results = {"throughput": throughput(tokens, runs, shards),
               "failover": failover(np.resize(base, min(n_tokens, 6_000_000)), failover_runs,
                                    2)}
    tp, fo = results["throughput"], results["failover"]
    print(f"backend {tp['backend']}; {tp['row_groups']} row groups, "
          f"{tp['compressed_bytes'] / 1e6:.1f} MB")
    for name, rate in tp["mtok_per_s"].items():
        print(f"  {name:10} {rate:7.1f} Mtok/s  (median {tp['median_s'][name]:.2f} s)")
    print(f"  shardflow / raw s3fs = {tp['ratio_shardflow_vs_raw']:.2f} (aim >= 0.8)")
    print(f"failover: time lost {fo['median_lost_s']:.2f} s median over {fo['runs']} runs "
          f"(aim < 2 s); per run {[round(x, 2) for x in fo['lost_s']]}")
    path = write_results("storage_read", results)
    plot(results, RESULTS / "storage_read.png")
    print(f"results: {path} and {RESULTS / 'storage_read.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
