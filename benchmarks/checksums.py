"""What verifying a row-group piece costs: GB/s on one core for the checksums a loader could use.

A loader verifies every piece it reads, every epoch, so the checksum's cost is paid per token
for the whole of training. This measures, on the calling thread, pieces of the size the
pipeline writes (~0.6 MB: a 256 Ki-token row group of GPT-2 ids after zstd), real token bytes
(a shard of the Shakespeare GPT-2 stream) rather than random ones:

- ``sha256`` (hashlib / OpenSSL; SHA-NI where the CPU has it): what pieces used before;
- ``blake3`` (the ``blake3`` package): what the pipeline records now (``storage.format.checksums``);
- ``xxh3_128`` (``xxhash``) and ``crc32c`` (``google-crc32c``): non-cryptographic, for scale;
  measured when installed, never chosen (a replica could match them by design).

The figure per billion tokens assumes 1.1 bytes per token, what zstd leaves of uint16 GPT-2
ids. Medians of ``--runs`` rounds, the functions interleaved within each round.

    python benchmarks/checksums.py            # ~20 s; JSON and PNG in benchmarks/results/
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, write_results  # noqa: E402

PIECE_BYTES = 600_000
BYTES_PER_TOKEN = 1.1


def candidates() -> dict[str, Callable[[memoryview], object]]:
    import blake3

    out: dict[str, Callable[[memoryview], object]] = {
        "sha256": lambda b: hashlib.sha256(b).digest(),
        "blake3": lambda b: blake3.blake3(b).digest(),
    }
    try:
        xxhash = importlib.import_module("xxhash")
        out["xxh3_128"] = lambda b: xxhash.xxh3_128_digest(b)
    except ImportError:
        pass
    try:
        crc = importlib.import_module("google_crc32c")
        out["crc32c"] = lambda b: crc.value(bytes(b))
    except ImportError:
        pass
    return out


def pieces(total_bytes: int) -> list[memoryview]:
    """Real compressed token bytes: the Shakespeare GPT-2 ids, zstd-compressed as the pipeline
    does, cut into pieces of ``PIECE_BYTES``."""
    import numpy as np
    import zstandard

    from benchmarks.loader_throughput import base_tokens

    tokens = base_tokens(Path("/tmp/shardflow-loader-bench")).astype(np.uint16)
    blob = zstandard.ZstdCompressor(level=3).compress(tokens.tobytes())
    data = (blob * (total_bytes // len(blob) + 1))[:total_bytes]
    view = memoryview(data)
    return [view[i:i + PIECE_BYTES] for i in range(0, len(data) - PIECE_BYTES + 1, PIECE_BYTES)]


def measure(fns: dict[str, Callable[[memoryview], object]], data: list[memoryview],
            runs: int) -> dict[str, dict[str, float]]:
    rates: dict[str, list[float]] = {name: [] for name in fns}
    nbytes = sum(len(p) for p in data)
    for _ in range(runs):
        for name, fn in fns.items():
            t0 = time.thread_time()
            for piece in data:
                fn(piece)
            rates[name].append(nbytes / (time.thread_time() - t0) / 1e9)
    out = {}
    for name, values in rates.items():
        gbps = statistics.median(values)
        out[name] = {"gb_per_s": gbps, "cpu_s_per_gtok": BYTES_PER_TOKEN / gbps,
                     "runs": values}
    return out


def plot(results: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(names, [results[n]["cpu_s_per_gtok"] for n in names],
            color=["#c44" if n == "sha256" else "#4a4" if n == "blake3" else "#999"
                   for n in names])
    ax.set_xlabel("CPU-s per billion tokens to verify (1.1 B/token)")
    ax.set_title("Piece checksums, one core (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="bytes hashed per round (MB)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    data = pieces(args.mb << 20)
    results = measure(candidates(), data, args.runs)
    base = results["sha256"]["gb_per_s"]
    for name, r in results.items():
        print(f"{name:10} {r['gb_per_s']:6.2f} GB/s  {r['cpu_s_per_gtok']:5.2f} CPU-s/Gtok  "
              f"{r['gb_per_s'] / base:5.2f}x sha256")
    path = write_results("checksums", {"piece_bytes": PIECE_BYTES, "runs": args.runs,
                                       "bytes_per_token": BYTES_PER_TOKEN,
                                       "results": results})
    plot(results, RESULTS / "checksums.png")
    print(f"results: {path} and {RESULTS / 'checksums.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
