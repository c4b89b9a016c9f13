"""Does the loader keep a GPU fed? A simulated accelerator consuming at real GPUs' token rates.

The consumer takes a batch, then "computes" for ``tokens / rate`` seconds (a sleep: like a
CUDA step, it leaves the host CPU to the loader), while the loader reads from a real S3 server
on loopback. Data-wait fraction = time blocked on ``next(batch)`` / wall time (aim < 1 %).

Rates (tokens/s a trainer consumes), from 6N + 12·L·d·T FLOPs per token and the H100's
989 TFLOP/s dense bf16 at 40 % MFU:

- GPT-2 small (124 M params, 12 layers, d=768, T=1024): ~8.5e8 FLOP/token -> ~465 k tok/s
  on one H100; one 8-GPU node: ~3.7 M tok/s (one loader per GPU; on a real host each has its
  own cores, here all share 2).
- ~1 B params (24 layers, d=2048, T=2048): ~7.2e9 FLOP/token -> ~55 k tok/s per H100.

Then the rate is raised until the wait exceeds 1 %: the highest rate these 2 cores sustain.

    python benchmarks/io_keeps_pace.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import (  # noqa: E402
    median,
    shakespeare_tokens,
    write_results,
    write_token_dataset,
)
from loaders import build_dataloader  # noqa: E402
from loopback_s3 import start_servers  # noqa: E402
from storage import ReplicaSet  # noqa: E402

H100_BF16 = 989e12
MFU = 0.40


def tokens_per_s(params: float, layers: int, width: int, seq: int) -> float:
    flops = 6 * params + 12 * layers * width * seq
    return H100_BF16 * MFU / flops


RATES = {
    "1B on 1x H100": tokens_per_s(1.0e9, 24, 2048, 2048),
    "GPT-2 small on 1x H100": tokens_per_s(124e6, 12, 768, 1024),
    "GPT-2 small on 8x H100 (one node)": 8 * tokens_per_s(124e6, 12, 768, 1024),
}


def consume(url: str, options: dict, rate: float, seconds: float, batch: int, seq: int) -> dict:
    """Feed a consumer at ``rate`` tok/s for about ``seconds``; wait fraction and timings.

    Steady state is what a long training run sees, so every measurement lasts long enough
    (at least 30 batches) for the read-ahead to matter, whatever the rate.
    """
    batches = max(30, int(seconds * rate / (batch * seq)))
    loader = build_dataloader(url, batch, seq, rank=0, world_size=1, storage_options=options,
                              batch_thread=True)  # as the trainer builds it
    step = batch * seq / rate
    wait = 0.0
    t0 = time.perf_counter()
    it = iter(loader)
    first = None
    for _ in range(batches):
        w0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            loader.set_epoch(loader.epoch + 1)
            it = iter(loader)
            next(it)
        waited = time.perf_counter() - w0
        if first is None:
            first = waited  # time to first batch: start-up, reported apart
        else:
            wait += waited
        time.sleep(step)
    wall = time.perf_counter() - t0 - (first or 0.0)
    return {"rate": rate, "batches": batches, "wait_frac": wait / wall, "first_batch_s": first,
            "delivered_tok_per_s": batches * batch * seq / (wall + (first or 0.0))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=40e6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n_tokens, runs, seconds = int(args.tokens), args.runs, 4.0
    if args.quick:
        n_tokens, runs, seconds = 4_000_000, 1, 1.0
    (server,) = start_servers(1)
    try:
        bucket = server.make_bucket("bench-pace")
        url = f"{bucket.url}/ds"
        tokens = np.resize(shakespeare_tokens(), n_tokens)
        write_token_dataset(ReplicaSet.from_urls([url], bucket.storage_options), tokens,
                            max(2, n_tokens // 8_000_000))
        named = {}
        for name, rate in RATES.items():
            rs = [consume(url, bucket.storage_options, rate, seconds, args.batch, args.seq)
                  for _ in range(runs)]
            named[name] = {"rate_tok_s": rate, "wait_frac": median([r["wait_frac"] for r in rs]),
                           "first_batch_s": median([r["first_batch_s"] for r in rs]),
                           "runs": rs}
            print(f"{name:36} {rate / 1e6:7.2f} M tok/s   data wait "
                  f"{100 * named[name]['wait_frac']:6.2f} %   first batch "
                  f"{named[name]['first_batch_s']:.2f} s")
        sweep = []
        rate = 0.25e6
        while rate <= 256e6:
            rs = [consume(url, bucket.storage_options, rate, seconds, args.batch, args.seq)
                  for _ in range(runs)]
            wf = median([r["wait_frac"] for r in rs])
            sweep.append({"rate_tok_s": rate, "wait_frac": wf,
                          "delivered_tok_per_s": median([r["delivered_tok_per_s"] for r in rs])})
            print(f"sweep {rate / 1e6:8.1f} M tok/s   data wait {100 * wf:6.2f} %")
            if wf > 0.01:
                break
            rate *= 2
        sustained = max((s["rate_tok_s"] for s in sweep if s["wait_frac"] <= 0.01), default=0.0)
        print(f"highest rate with < 1 % data wait on these 2 cores: {sustained / 1e6:.1f} M tok/s "
              f"({sustained / RATES['GPT-2 small on 8x H100 (one node)']:.1f}x one 8-GPU node "
              "of GPT-2 small)")
    finally:
        server.stop()
    results = {"backend": server.backend, "tokens": n_tokens, "batch": args.batch,
               "seq": args.seq, "mfu_assumed": MFU, "h100_bf16_flops": H100_BF16,
               "named_rates": named, "sweep": sweep, "sustained_tok_s": sustained,
               "quick": args.quick}
    path = write_results("io_keeps_pace" + ("_quick" if args.quick else ""), results)
    plot(results, path.with_suffix(".png"))
    print(f"results: {path}")
    return 0


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    sweep = results["sweep"]
    ax.plot([s["rate_tok_s"] / 1e6 for s in sweep], [100 * s["wait_frac"] for s in sweep],
            marker="o", label="rate sweep")
    for name, r in results["named_rates"].items():
        ax.scatter([r["rate_tok_s"] / 1e6], [100 * r["wait_frac"]], marker="x", s=60)
        ax.annotate(name, (r["rate_tok_s"] / 1e6, 100 * r["wait_frac"]), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.axhline(1.0, color="red", linestyle=":", label="1 % target")
    ax.set_xscale("log")
    ax.set_xlabel("consumer rate (M tokens/s)")
    ax.set_ylabel("data wait (% of wall time)")
    ax.set_title(f"loader from S3 ({results['backend']}), batch "
                 f"{results['batch']}x{results['seq']}: sustains "
                 f"{results['sustained_tok_s'] / 1e6:.2f} M tok/s with < 1 % wait")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
