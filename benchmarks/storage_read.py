"""Row-group reads through ``storage`` vs raw s3fs, and what a dead or hung replica costs a reader.

Everything runs against real S3 servers on loopback (MinIO or SeaweedFS, started here):

1. Throughput: every row group of a dataset read and decoded to token arrays, once through
   Shardflow's reader (replica set, one ranged GET per row group, sha256 verified) and once
   the usual way with raw s3fs (``ParquetFile(fs.open(path)).read_row_group``), one thread
   each, alternating, medians over ``--runs``. Aim: Shardflow >= 0.8x raw.
2. Faults: the loader iterates a dataset stored on two servers with storage's default
   timeouts; a quarter of the way through the epoch the preferred server is either
   SIGKILLed ("kill": connections refused) or SIGSTOPped ("hang": connections accepted,
   never answered; SIGCONT after the epoch). ``lookahead_groups=1``, so that every row-group
   read is on the critical path and a stall shows in the batch waits (the worst case; the
   default read-ahead hides most of it). Per mode, medians over ``--fault-runs``:
   - ``max_batch_wait_s``: the longest wait for one batch in the disturbed epoch;
   - ``first_read_after_fault_s``: how long the first row-group read issued after the
     fault took (until its verified bytes were in hand);
   - ``longest_read_after_fault_s``: the longest such read, including those in flight when
     the fault hit;
   - ``time_lost_s``: disturbed epoch - undisturbed epoch, same servers.
   Aim: max batch wait < 2 s for both.

    python benchmarks/storage_read.py            # full run
    python benchmarks/storage_read.py --quick    # smoke test, well under a minute
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
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
from loopback_s3 import start_servers  # noqa: E402
from storage import ReplicaSet, resolve  # noqa: E402
from storage import tokens as token_codec  # noqa: E402


def read_shardflow(url: str, options: dict) -> tuple[int, int]:
    store = ReplicaSet.from_urls([url], options)
    manifest = store.read_manifest()
    reader = TokenReader(store, RowGroupIndex.open(store, manifest))
    tokens = 0
    for shard in np.unique(reader.index.shard_of).tolist():
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
                arr = token_codec.unpack(table.column(0), manifest.schema["input_ids"])
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


CLIENT_SIZES = (512 << 10, 4 << 20)
CLIENT_THREADS = 4


def _cpu() -> float:
    r = os.times()
    return r.user + r.system


def _client_readers(bucket, key: str) -> dict:  # type: ignore[no-untyped-def]
    """name -> read(start, end) for each client, all on the same object."""
    import s3fs
    from pyarrow import fs as pafs

    from storage.io.clients import ObstoreS3FileSystem, s3_config

    opts = bucket.storage_options
    path = f"{bucket.name}/{key}"
    raw = s3fs.S3FileSystem(**opts)
    fast = ObstoreS3FileSystem(f"s3://{path}", opts, s3_config(opts))
    endpoint = opts["client_kwargs"]["endpoint_url"]
    arrow = pafs.S3FileSystem(access_key=opts["key"], secret_key=opts["secret"],
                              endpoint_override=endpoint.split("://")[1],
                              scheme=endpoint.split("://")[0], region="us-east-1")
    arrow_file = arrow.open_input_file(path)
    readers = {"s3fs": lambda a, b: raw.cat_file(path, start=a, end=b),
               "obstore": lambda a, b: fast.read_range(path, a, b),
               "pyarrow": lambda a, b: arrow_file.read_at(b - a, a)}
    client = _boto3_client(opts)
    if client is not None:  # one client, shared by the threads (boto3 clients are thread-safe)
        readers["boto3"] = lambda a, b: client.get_object(
            Bucket=bucket.name, Key=key, Range=f"bytes={a}-{b - 1}")["Body"].read()
    return readers


def _boto3_client(opts: dict):  # type: ignore[no-untyped-def]
    """A boto3 S3 client for the loopback server, or None where boto3 is not installed (it is
    a peer's dependency, installed by ``make bench-peers``, not ours)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        return None
    return boto3.client("s3", aws_access_key_id=opts["key"], aws_secret_access_key=opts["secret"],
                        endpoint_url=opts["client_kwargs"]["endpoint_url"],
                        region_name="us-east-1",
                        config=Config(max_pool_connections=CLIENT_THREADS * 2,
                                      s3={"addressing_style": "path"}))


def _transfer_manager(bucket, key: str, size: int, nbytes: int) -> tuple[float, float] | None:  # type: ignore[no-untyped-def]
    """The whole object through boto3's transfer manager (``download_fileobj``: concurrent
    ranged GETs of ``size`` bytes on ``CLIENT_THREADS`` threads): seconds and CPU-seconds."""
    import io

    client = _boto3_client(bucket.storage_options)
    if client is None:
        return None
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(multipart_threshold=size, multipart_chunksize=size,
                            max_concurrency=CLIENT_THREADS, use_threads=True)
    sink = io.BytesIO()
    c0, t0 = _cpu(), time.perf_counter()
    client.download_fileobj(bucket.name, key, sink, Config=config)
    took = time.perf_counter() - t0, _cpu() - c0
    assert sink.getbuffer().nbytes == nbytes
    return took


def clients(runs: int, object_mb: int = 128) -> dict:
    """Ranged GETs of one object through each client, and checksum costs, per GB."""
    import hashlib
    import zlib
    from concurrent.futures import ThreadPoolExecutor

    data = os.urandom(object_mb << 20)
    out: dict = {"object_bytes": len(data), "threads": CLIENT_THREADS, "runs": runs,
                 "gets": {}, "checksums": {}}
    (server,) = start_servers(1)
    try:
        bucket = server.make_bucket("bench-clients")
        ReplicaSet.from_urls([bucket.url], bucket.storage_options).put("blob", data)
        readers = _client_readers(bucket, "blob")
        out["backend"] = server.backend
        for size in CLIENT_SIZES:
            ranges = [(a, min(a + size, len(data))) for a in range(0, len(data), size)]
            rows: dict[str, list[tuple[float, float]]] = {name: [] for name in readers}
            for run in range(runs):
                names = list(readers) if run % 2 == 0 else list(readers)[::-1]
                for name in names:
                    read = readers[name]
                    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
                        c0, t0 = _cpu(), time.perf_counter()
                        got = sum(len(x) for x in pool.map(lambda r, f=read: f(*r), ranges))
                        rows[name].append((time.perf_counter() - t0, _cpu() - c0))
                    assert got == len(data), (name, got)
                whole = _transfer_manager(bucket, "blob", size, len(data))
                if whole is not None:
                    rows.setdefault("boto3 transfer manager (whole object)", []).append(whole)
            gb = len(data) / 1e9
            out["gets"][str(size)] = {
                name: {"mb_per_s": gb * 1e3 / median([t for t, _ in r]),
                       "cpu_s_per_gb": median([c for _, c in r]) / gb}
                for name, r in rows.items()}
    finally:
        server.stop()
    import blake3

    sums = {"sha256": lambda b: hashlib.sha256(b).digest(),
            "blake3": lambda b: blake3.blake3(b).digest(),
            "crc32 (zlib)": lambda b: zlib.crc32(b)}
    try:
        import xxhash

        sums["xxh3_64"] = lambda b: xxhash.xxh3_64_digest(b)
    except ImportError:
        pass
    piece = memoryview(data)[:512 << 10]
    for name, fn in sums.items():
        t0 = time.perf_counter()
        n = 0
        while n < (256 << 20):
            fn(piece)
            n += len(piece)
        out["checksums"][name] = {"cpu_s_per_gb": (time.perf_counter() - t0) / (n / 1e9)}
    return out


MODES = ("kill", "hang")
FAULT_BATCH, FAULT_SEQ = 8, 2048
#: small row groups, so that each of the 8 lanes reads through the whole epoch (with large ones
#: every group is fetched in the first quarter and a fault there meets no read)
FAULT_ROW_GROUP_TOKENS = 32 * 1024


def _default_options(bucket) -> dict:  # type: ignore[no-untyped-def]
    """Endpoint and credentials only: timeouts and retries are storage's own defaults."""
    opts = bucket.storage_options
    return {"key": opts["key"], "secret": opts["secret"], "client_kwargs": opts["client_kwargs"]}


def _signal_all(server, sig: int) -> None:  # type: ignore[no-untyped-def]
    for pid in server.pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _epoch(urls: list[str], options: list[dict], at: int | None = None, fault=None) -> dict:  # type: ignore[no-untyped-def]
    """One epoch; ``fault()`` after batch ``at``. Batch waits and every store read's span."""
    loader = build_dataloader(urls[0], FAULT_BATCH, FAULT_SEQ, rank=0, world_size=1,
                              replicas=urls[1:], replica_options=options,
                              return_sample_id=True, lookahead_groups=1)
    store = loader.dataset.store
    reads: list[tuple[float, float]] = []
    plain_read = store.read

    def timed_read(*args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = plain_read(*args, **kwargs)
        reads.append((t0, time.perf_counter()))
        return out

    store.read = timed_read  # the reader calls store.read: each call's start and end
    waits, stamps, ids, fault_at = [], [], [], None
    t_start = time.perf_counter()
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        waits.append(time.perf_counter() - t0)
        stamps.append(time.perf_counter() - t_start)
        ids += batch["sample_id"].tolist()
        if at is not None and len(waits) == at:
            fault_at = time.perf_counter()
            fault()
            t_start += time.perf_counter() - fault_at  # not the reader's time: killing, reaping
    total = time.perf_counter() - t_start
    out = {"total_s": total, "waits": waits, "ids": ids, "max_batch_wait_s": max(waits),
           "hedges": store.hedges, "failovers": store.failovers, "errors": dict(store.errors),
           "timeline": stamps}
    if fault_at is not None:
        after = sorted((s, e) for s, e in reads if e > fault_at)
        issued = [(s, e) for s, e in after if s >= fault_at]
        out["fault_at_batch"] = at
        out["reads_after_fault"] = len(after)
        out["first_read_after_fault_s"] = issued[0][1] - issued[0][0] if issued else None
        out["longest_read_after_fault_s"] = max((e - max(s, fault_at) for s, e in after),
                                                default=None)
    return out


def faults(tokens: np.ndarray, runs: int) -> dict:
    per_mode: dict[str, list[dict]] = {m: [] for m in MODES}
    clean_runs: list[dict] = []
    for _run in range(runs):
        servers = start_servers(2)
        try:
            buckets = [s.make_bucket("bench-faults") for s in servers]
            urls = [f"{b.url}/ds" for b in buckets]
            opts = [_default_options(b) for b in buckets]
            write_token_dataset(ReplicaSet.from_urls(urls, replica_options=opts), tokens, 2,
                                row_group_tokens=FAULT_ROW_GROUP_TOKENS)
            clean = _epoch(urls, opts)
            clean_runs.append(clean)
            at = len(clean["waits"]) // 4
            try:  # hang first: the server survives it (SIGCONT), a kill it does not
                stop = functools.partial(_signal_all, servers[0], signal.SIGSTOP)
                hang = _epoch(urls, opts, at, stop)
            finally:
                _signal_all(servers[0], signal.SIGCONT)
            kill = _epoch(urls, opts, at, servers[0].kill)
            for mode, result in (("hang", hang), ("kill", kill)):
                assert result["ids"] == clean["ids"], f"{mode}: samples differ from clean run"
                result["time_lost_s"] = result["total_s"] - clean["total_s"]
                per_mode[mode].append(result)
        finally:
            for s in servers:
                _signal_all(s, signal.SIGCONT)
                s.stop()
    keys = ("max_batch_wait_s", "first_read_after_fault_s", "longest_read_after_fault_s",
            "time_lost_s")
    summary: dict = {"runs": runs, "batch": FAULT_BATCH, "seq_len": FAULT_SEQ,
                     "tokens": int(len(tokens)), "lookahead_groups": 1,
                     "row_group_tokens": FAULT_ROW_GROUP_TOKENS,
                     "clean_max_batch_wait_s": median([c["max_batch_wait_s"] for c in clean_runs]),
                     "clean_total_s": [c["total_s"] for c in clean_runs]}
    for mode, results in per_mode.items():
        entry: dict = {f"median_{k}": median([r[k] for r in results if r[k] is not None])
                       for k in keys}
        entry.update({k: [r[k] for r in results] for k in keys})
        entry.update({k: [r[k] for r in results]
                      for k in ("hedges", "failovers", "errors", "reads_after_fault")})
        summary[mode] = entry
    summary["timeline"] = {"clean": clean_runs[0]["timeline"],
                           "fault_at_batch": per_mode["kill"][0]["fault_at_batch"],
                           **{m: per_mode[m][0]["timeline"] for m in MODES}}
    return summary


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.2))
    tp = results["throughput"]["mtok_per_s"]
    ax1.bar(list(tp), list(tp.values()), color=["tab:blue", "tab:gray"])
    ax1.set_ylabel("Mtokens/s (read + decode, 1 thread)")
    ax1.set_title(f"row-group reads from S3: "
                  f"{results['throughput']['ratio_shardflow_vs_raw']:.2f}x raw s3fs")
    fo = results["faults"]
    tl = fo["timeline"]
    ax2.plot(tl["clean"], label="undisturbed")
    ax2.plot(tl["kill"], label="preferred replica SIGKILLed")
    ax2.plot(tl["hang"], label="preferred replica SIGSTOPped (hung)")
    ax2.axvline(tl["fault_at_batch"], color="red", linestyle=":", label="fault")
    ax2.set_xlabel("batch")
    ax2.set_ylabel("elapsed s")
    ax2.set_title("one epoch, lookahead 1 (first run)")
    ax2.legend(fontsize=8)
    labels = ["longest batch wait", "first read after fault", "longest read after fault"]
    keys = ["median_max_batch_wait_s", "median_first_read_after_fault_s",
            "median_longest_read_after_fault_s"]
    x = np.arange(len(labels))
    for i, mode in enumerate(("kill", "hang")):
        vals = [fo[mode][k] for k in keys]
        bars = ax3.bar(x + (i - 0.5) * 0.38, vals, 0.38, label=mode)
        ax3.bar_label(bars, fmt="%.2f", fontsize=8)
    ax3.axhline(2.0, color="red", linestyle=":", label="aim: batch wait < 2 s")
    ax3.set_xticks(x, labels, fontsize=8)
    ax3.set_ylabel(f"seconds (median of {fo['runs']} runs)")
    ax3.set_title("stall from a dead or hung preferred replica")
    ax3.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=30e6, help="tokens in the dataset")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fault-runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small and few runs (smoke test)")
    parser.add_argument("--clients", action="store_true",
                        help="only the client comparison: ranged GETs of 512 KiB and 4 MiB "
                             "through s3fs, obstore, pyarrow and boto3 (and the whole object "
                             "through boto3's transfer manager at those part sizes), MB/s and "
                             "CPU-s/GB, and the checksums' CPU-s/GB (storage_read_clients.json)")
    args = parser.parse_args()
    if args.clients:
        got = clients(3 if not args.quick else 1, 128 if not args.quick else 16)
        for size, row in got["gets"].items():
            for name, r in row.items():
                print(f"  GET {int(size) >> 10:5} KiB x{CLIENT_THREADS} {name:38} "
                      f"{r['mb_per_s']:7.0f} MB/s {r['cpu_s_per_gb']:6.2f} CPU-s/GB")
        for name, r in got["checksums"].items():
            print(f"  {name:14} {r['cpu_s_per_gb']:6.3f} CPU-s/GB")
        print(f"results: {write_results('storage_read_clients', got)}")
        return 0
    n_tokens, runs, fault_runs = int(args.tokens), args.runs, args.fault_runs
    if args.quick:
        n_tokens, runs, fault_runs = 3_000_000, 2, 1
    base = shakespeare_tokens()
    tokens = np.resize(base, n_tokens)
    shards = max(2, n_tokens // 4_000_000)
    print(f"dataset: {n_tokens / 1e6:.1f} M tokens of Shakespeare (GPT-2 BPE), {shards} shards")
    results = {"throughput": throughput(tokens, runs, shards),
               "faults": faults(np.resize(base, min(n_tokens, 6_000_000)), fault_runs)}
    tp, fo = results["throughput"], results["faults"]
    print(f"backend {tp['backend']}; {tp['row_groups']} row groups, "
          f"{tp['compressed_bytes'] / 1e6:.1f} MB")
    for name, rate in tp["mtok_per_s"].items():
        print(f"  {name:10} {rate:7.1f} Mtok/s  (median {tp['median_s'][name]:.2f} s)")
    print(f"  shardflow / raw s3fs = {tp['ratio_shardflow_vs_raw']:.2f} (aim >= 0.8)")
    print(f"faults, medians of {fo['runs']} runs (undisturbed longest batch wait "
          f"{fo['clean_max_batch_wait_s']:.3f} s):")
    for mode in MODES:
        m = fo[mode]
        print(f"  {mode:4}: longest batch wait {m['median_max_batch_wait_s']:.3f} s (aim < 2 s), "
              f"first read after the fault {m['median_first_read_after_fault_s']:.3f} s, "
              f"longest read {m['median_longest_read_after_fault_s']:.3f} s, "
              f"time lost {m['median_time_lost_s']:.2f} s; hedges {m['hedges']}")
    for key in ("clean_total_s",):
        fo[key] = [round(x, 4) for x in fo[key]]
    path = write_results("storage_read", results)
    plot(results, RESULTS / "storage_read.png")
    print(f"results: {path} and {RESULTS / 'storage_read.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
