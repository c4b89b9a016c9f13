"""How long a hung rank goes unnoticed: a 2-process torchrun job (gloo, a tiny model, a
pipeline-made dataset of ~40 k tokens), rank 1 SIGSTOPped from outside at a random step;
the time from the stop to the heartbeat's ``trainer: hang: rank 1 ...`` line.

Baseline, interleaved in the same rounds: the same job with the heartbeat off
(``--hang-timeout 0``): the hang goes unreported until the process group's timeout (30 min
for gloo), so each baseline round watches for a report for ``--watch`` seconds (default 3x the
timeout) and records that none came. Also per round: each job's median step time before the
stop (from its metrics.jsonl), with and without the heartbeat (noisy on a shared machine),
and, in process, what one ``beat()`` costs the training thread against the step time.

    python benchmarks/hang_detection.py [--timeout 10] [--runs 5] [--quick]

``--timeout 60`` measures the default setting (each round then lasts a few minutes).
Writes benchmarks/results/hang_detection.json and .png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import ROOT, median, write_results  # noqa: E402

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu"]


def make_dataset(root: Path, n_docs: int) -> str:
    """A word-level dataset (vocab 28) made by the pipeline, as the trainer tests make theirs."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    rng = random.Random(0)
    nxt = {w: rng.sample(WORDS, 2) for w in WORDS}
    docs = []
    for _ in range(n_docs):
        w = rng.choice(WORDS)
        words = [w]
        for _ in range(rng.randint(30, 50)):
            w = rng.choice(nxt[w])
            words.append(w)
        docs.append(" ".join(words))
    (root / "input.txt").write_text("\n\n".join(docs) + "\n")
    tok = Tokenizer(WordLevel({"[UNK]": 0, "<eos>": 1, **{w: i + 2 for i, w in
                                                          enumerate(WORDS)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(root / "tokenizer.json"))
    out = root / "ds"
    subprocess.run([sys.executable, "-m", "pipeline", "run", str(root / "input.txt"),
                    "--output", str(out), "--tokenizer", str(root / "tokenizer.json"),
                    "--workers", "1", "--row-group-tokens", "2048", "--dashboard-address",
                    ":0", "--no-progress"], cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    return str(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_pid(launcher: subprocess.Popen, rank: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        for p in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if p.environ().get("RANK") == str(rank) and "trainer" in p.cmdline():
                    return p.pid
            except psutil.Error:
                continue
        time.sleep(0.05)
    raise RuntimeError(f"rank {rank} did not start")


def last_step(path: Path) -> int:
    try:
        lines = path.read_text().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


def one_round(data: str, tmp: Path, timeout: float, watch: float, stop_at: int) -> dict:
    """One job: run to ``stop_at``, SIGSTOP rank 1, wait for the report (or ``watch`` s)."""
    run_dir = tmp / f"run-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
           "--max-restarts", "0", "--monitor-interval", "0.2",
           "-m", "trainer", "--data", data, "--steps", "100000", "--global-batch-size", "6",
           "--layers", "1", "--width", "32", "--heads", "2", "--seq-len", "64", "--device",
           "cpu", "--log-every", "5", "--run-dir", str(run_dir),
           "--hang-timeout", str(timeout), "--hang-timeout-io", str(max(60.0, timeout))]
    log = tmp / f"{run_dir.name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"},
                                start_new_session=True)
    try:
        pid = rank_pid(proc, 1, time.monotonic() + 120)
        samples = run_dir / "rank1_samples.jsonl"
        while last_step(samples) < stop_at:
            if proc.poll() is not None:
                raise RuntimeError(f"job ended early:\n{log.read_text()[-3000:]}")
            time.sleep(0.005)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        detected = None
        while time.monotonic() - stopped < watch:
            if "trainer: hang: rank 1 " in log.read_text(errors="replace"):
                detected = time.monotonic() - stopped
                break
            time.sleep(0.02)
        metrics = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text()
                   .splitlines() if '"step_time_s"' in ln]
        step_s = median([m["step_time_s"] for m in metrics[1:]]) if len(metrics) > 1 else None
    finally:
        for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    report = re.search(r"trainer: hang: rank (\d+) .* last phase '([\w-]+)' at step (\d+)",
                       log.read_text(errors="replace"))
    return {"hang_timeout": timeout, "stop_at": stop_at, "detected_s": detected,
            "named_rank": int(report.group(1)) if report else None,
            "phase": report.group(2) if report else None, "median_step_s": step_s}


def beat_cost_ns(n: int = 200_000) -> float:
    """What the training thread pays per beat (the loop makes 3 a step): median of 5."""
    import torch.distributed as dist

    from trainer.heartbeat import Heartbeat

    hb = Heartbeat(dist.HashStore(), 0, 1, timeout=60.0, timeout_io=600.0)
    hb.beat("data", 0)
    hb._publish()  # as in a run: the last record published is of a step, not of the start
    times = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for i in range(n):
            hb.beat("data" if i % 2 else "step", i)
        times.append((time.perf_counter_ns() - t0) / n)
    return median(times)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    on = [r["detected_s"] for r in results["heartbeat"]]
    ax.bar(range(len(on)), on, color="tab:blue", label="heartbeat on: time to the report")
    ax.axhline(results["timeout_s"], color="k", ls="--", label=f"--hang-timeout "
                                                                f"{results['timeout_s']:g} s")
    ax.axhline(results["watch_s"], color="tab:red", ls=":",
               label=f"heartbeat off: no report within {results['watch_s']:g} s "
                     f"(process group timeout 1800 s)")
    ax.set_xlabel("round")
    ax.set_ylabel("seconds from SIGSTOP of rank 1")
    ax.set_title("Hang detection, 2 ranks (gloo), torchrun")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=float, default=10.0, help="--hang-timeout of the jobs")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--watch", type=float, default=None,
                    help="how long a baseline round waits for a report (default 3x timeout)")
    ap.add_argument("--quick", action="store_true", help="2 rounds at a 5 s timeout")
    args = ap.parse_args()
    if args.quick:
        args.timeout, args.runs = 5.0, 2
    watch = args.watch or 3 * args.timeout
    load_before = os.getloadavg()[0]
    beat_ns = beat_cost_ns()
    rng = random.Random(0)
    on, off = [], []
    with tempfile.TemporaryDirectory(prefix="hang-bench-") as tmp:
        data = make_dataset(Path(tmp), 1000)
        for i in range(args.runs):  # interleaved: heartbeat on, off, on, off...
            stop_at = rng.randrange(20, 60)
            on.append(one_round(data, Path(tmp), args.timeout, 10 * args.timeout + 60, stop_at))
            off.append(one_round(data, Path(tmp), 0.0, watch, stop_at))
            print(f"round {i + 1}: detected after {on[-1]['detected_s']:.2f} s (rank "
                  f"{on[-1]['named_rank']}, phase {on[-1]['phase']}); heartbeat off: "
                  f"{'no report' if off[-1]['detected_s'] is None else 'REPORT?'} in "
                  f"{watch:g} s; step {on[-1]['median_step_s']} s on vs "
                  f"{off[-1]['median_step_s']} s off", flush=True)
    detected = [r["detected_s"] for r in on if r["detected_s"] is not None]
    step_ratios = [a["median_step_s"] / b["median_step_s"] for a, b in zip(on, off, strict=True)
                   if a["median_step_s"] and b["median_step_s"]]
    results = {
        "timeout_s": args.timeout, "watch_s": watch, "runs": args.runs,
        "heartbeat": on, "baseline_heartbeat_off": off,
        "detected_all": len(detected) == len(on) and all(r["named_rank"] == 1 for r in on),
        "detection_median_s": median(detected) if detected else None,
        "detection_max_s": max(detected) if detected else None,
        "detection_over_timeout_median": median(detected) / args.timeout if detected else None,
        "baseline_reports": sum(r["detected_s"] is not None for r in off),
        "step_time_ratio_on_off_median": median(step_ratios) if step_ratios else None,
        "beat_ns": beat_ns,
        "beats_per_step_over_step_time_pct": 100 * 3 * beat_ns * 1e-9 / median(
            [r["median_step_s"] for r in on if r["median_step_s"]]),
        "load_before": load_before, "load_after": os.getloadavg()[0],
    }
    name = "hang_detection_quick" if args.quick else "hang_detection"
    path = write_results(name, results)
    plot(results, path.with_suffix(".png"))
    print(json.dumps({k: v for k, v in results.items()
                      if k not in ("heartbeat", "baseline_heartbeat_off")}, indent=1))
    print(f"wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
