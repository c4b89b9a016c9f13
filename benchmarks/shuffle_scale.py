"""The dedup shuffle over many partitions: key groups against one key file per partition.

Writes ``--partitions`` partitions' dedup key files (random 128-bit keys, ``--dup-share`` of
them repeating a key of an earlier partition) to a store, then runs ``pipeline.dedup.shuffle.run``,
the driver's own code, with a pool of ``--workers`` threads standing for the Dask workers,
two ways, alternating, ``--runs`` times each:

* ``grouped``: the pipeline's layout, consecutive partitions in key groups of a task's size;
* ``per_partition``: every partition its own group (``per_task=1``), the layout before key
  groups: each bucket reads one range per partition and the driver holds partition x bucket
  count matrices.

Both must find the same drops. ``--task-keys`` shrinks a task's keys (the pipeline's is
512 Ki) so that a few million keys on this machine make as many buckets as a corpus thousands
of times larger: the reads of a step are buckets x groups, so the per-partition layout pays
``partitions / groups`` times more of them. Stores: a local directory and a bucket on the
loopback S3 server (SeaweedFS or MinIO, ``loopback_s3``), where every read is a GET.

Figures: seconds (median), ranged reads, the driver's count matrices (bytes), and the ratio
``per_partition_s / grouped_s`` per store. JSON to benchmarks/results/shuffle_scale.json and
a PNG plot; ``--quick`` is a smoke test.

    python benchmarks/shuffle_scale.py [--partitions 1000] [--keys 1000] [--runs 3] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import secrets
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, median, write_results  # noqa: E402
from loopback_s3 import start_servers  # noqa: E402
from pipeline.dedup import (  # noqa: E402
    ENTRY,
    KIND_EXACT,
    shuffle,  # noqa: E402
)
from pipeline.tasks import work
from storage import ReplicaSet  # noqa: E402

LAYOUTS = ("grouped", "per_partition")


def write_keys(store: ReplicaSet, partitions: int, keys: int, dup_share: float,
               seed: int = 0) -> list[str]:
    """Each partition's key file, as phase 1 leaves it; a share of keys repeat earlier ones."""
    rng = np.random.default_rng(seed)
    names = [f"bench-{i:06d}" for i in range(partitions)]
    pool = np.zeros(0, dtype=ENTRY)
    with ThreadPoolExecutor(16) as io:
        pending = []
        for i, name in enumerate(names):
            arr = np.zeros(keys, dtype=ENTRY)
            arr["k0"], arr["k1"] = rng.integers(0, 2**63, size=(2, keys), dtype=np.uint64)
            arr["pos"], arr["kind"] = np.arange(keys), KIND_EXACT
            repeat = rng.random(keys) < dup_share
            if len(pool) and repeat.any():
                src = pool[rng.integers(0, len(pool), size=int(repeat.sum()))]
                arr["k0"][repeat], arr["k1"][repeat] = src["k0"], src["k1"]
            if i == 0:
                pool = arr  # later partitions repeat keys of the first
            pending.append(io.submit(work.save_array, store, work.keys_path(name), arr))
        for f in pending:
            f.result()
    return names


def one_run(store: ReplicaSet, names: list[str], keys: int, layout: str, task_keys: int,
            workers: int) -> dict[str, Any]:
    """``shuffle.run`` over the written keys, tasks on a thread pool; then every pick."""
    with ThreadPoolExecutor(workers) as pool:
        def on_threads(name: str, fn: Any, args: list[tuple]) -> list[Any]:
            return list(pool.map(lambda a: fn(*a), args))

        per_key = [keys] * len(names)
        total = sum(per_key)
        buckets = max(1, -(-total // task_keys))
        t0 = time.perf_counter()
        out = shuffle.run(on_threads, store, f"run-{layout}", names, per_key, buckets,
                          task_keys if layout == "grouped" else 1)
        picked = list(pool.map(lambda p: (p, shuffle.pick(store, out.drops[p]).tobytes()),
                               sorted(out.drops)))
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "buckets": out.buckets, "groups": out.groups,
            "ranged_reads": out.ranged_reads, "driver_bytes": out.driver_bytes,
            "drops": sum(r.end - r.first for r in out.drops.values()),
            "checksum": hashlib.sha256(b"".join(b for _, b in picked)).hexdigest()}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stores = list(results["raw"])
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for j, layout in enumerate(LAYOUTS):
        mids = [results["seconds"][s][layout] for s in stores]
        xs = [i + (j - 0.5) * width for i in range(len(stores))]
        ax.bar(xs, mids, width, label=layout, color=["#3a7", "#777"][j])
        for x, v in zip(xs, mids, strict=True):
            ax.text(x, v, f"{v:.1f} s", ha="center", va="bottom")
    ax.set_xticks(range(len(stores)), [f"{s}: {results['ratios'][s]:.1f}x" for s in stores])
    ax.set_ylabel("shuffle + picks, s (median)")
    r = results["raw"][stores[0]]["grouped"][0]
    ax.set_title(f"{results['partitions']} partitions x {results['keys']} keys, "
                 f"{r['buckets']} buckets: {r['groups']} groups vs "
                 f"{results['partitions']} files")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--keys", type=int, default=1000, help="keys per partition")
    ap.add_argument("--task-keys", type=int, default=1 << 16,
                    help="keys per shuffle task (the pipeline's: 524288)")
    ap.add_argument("--dup-share", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="200 partitions, one run")
    args = ap.parse_args()
    parts, runs = (200, 1) if args.quick else (args.partitions, args.runs)
    raw: dict[str, dict[str, list[dict]]] = {}
    (server,) = start_servers(1)
    local = Path(tempfile.mkdtemp(prefix="bench-shuffle-"))
    try:
        bucket = server.make_bucket(f"shuffle-{secrets.token_hex(4)}")
        stores = {"local": ReplicaSet.from_urls([str(local)]),
                  f"s3 ({server.backend})": ReplicaSet.from_urls(
                      [f"{bucket.url}/ds"], storage_options=bucket.storage_options)}
        for name, store in stores.items():
            t0 = time.perf_counter()
            names = write_keys(store, parts, args.keys, args.dup_share)
            print(f"{name}: {parts} key files written in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            raw[name] = {layout: [] for layout in LAYOUTS}
            for r in range(runs):
                for layout in LAYOUTS:
                    x = one_run(store, names, args.keys, layout, args.task_keys, args.workers)
                    raw[name][layout].append(x)
                    print(f"run {r + 1}/{runs} {name:14s} {layout:13s} {x['seconds']:6.2f} s, "
                          f"{x['buckets']} buckets x {x['groups']} groups, "
                          f"{x['ranged_reads']:,} ranged reads, "
                          f"driver matrices {x['driver_bytes']:,} B, {x['drops']:,} drops",
                          flush=True)
            sums = {x["checksum"] for layout in LAYOUTS for x in raw[name][layout]}
            assert len(sums) == 1, f"{name}: the layouts found different drops"
    finally:
        server.stop()
        shutil.rmtree(local, ignore_errors=True)
    seconds = {s: {lay: median([x["seconds"] for x in v]) for lay, v in d.items()}
               for s, d in raw.items()}
    results = {
        "partitions": parts, "keys": args.keys, "task_keys": args.task_keys,
        "dup_share": args.dup_share, "workers": args.workers, "runs": runs,
        "quick": args.quick, "raw": raw, "seconds": seconds,
        "ratios": {s: v["per_partition"] / v["grouped"] for s, v in seconds.items()},
        "note": "seconds: shuffle.run (bucket keys, resolve, gather) plus every partition's "
                "pick, tasks on a thread pool of `workers`; ratio = per_partition / grouped "
                "seconds (above 1: key groups are faster); both layouts found the same drops",
    }
    name = "shuffle_scale_quick" if args.quick else "shuffle_scale"
    path = write_results(name, results)
    plot(results, RESULTS / f"{name}.png")
    for s, ratio in results["ratios"].items():
        print(f"{s}: grouped {seconds[s]['grouped']:.2f} s, per partition "
              f"{seconds[s]['per_partition']:.2f} s: {ratio:.1f}x")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
