"""What a pipeline worker's setup costs beside tokenizing: the two settings in
pipeline.driver.cluster.

* ``tokenizer_path``: two processes tokenize half of the corpus each on one thread (as two
  one-thread workers do), once with the tokenizer's serial path (``TOKENIZERS_PARALLELISM=
  false``) and once with a one-thread rayon pool (``true``, what workers get). Same ids.
* ``housekeeping``: one LocalCluster worker runs a tokenizing task; the worker process's CPU
  beyond the task thread's own is Dask's housekeeping (stack sampler, event-loop watchdog,
  monitors), at Dask's defaults and at ``pipeline.driver.cluster.QUIET_HOUSEKEEPING``.

Medians over ``--runs``, the variants interleaved; JSON to benchmarks/results/worker_overhead.json
and a PNG. ``--quick`` (~3 MB, one run) is a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, ROOT, machine, median, write_results  # noqa: E402
from benchmarks.pipeline_throughput import CORPUS_DIR, _texts, build_corpus  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _threads_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process (Linux: /proc/self/task)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def _encode_all(texts: list[str]) -> int:
    from pipeline.tasks import tokenizing

    tok = tokenizing._from_json(tokenizing.gpt2().json)
    n = 0
    for lo in range(0, len(texts), 1024):
        n += sum(len(e.ids) for e in tok.encode_batch_fast(texts[lo:lo + 1024],
                                                            add_special_tokens=False))
    return n


def child_half(files: list[Path], half: int) -> dict:
    """Tokenize every other document (``half`` 0 or 1) on this process's one thread."""
    texts = _texts(files)[half::2]
    c0, t0 = _cpu(), time.perf_counter()
    n = _encode_all(texts)
    return {"cpu_s": _cpu() - c0, "seconds": time.perf_counter() - t0, "tokens": n}


def child_worker(files: list[Path], quiet: bool) -> dict:
    """A one-worker LocalCluster tokenizing the corpus in one task: process vs task CPU."""
    from pipeline.driver import cluster

    if not quiet:
        cluster.QUIET_HOUSEKEEPING = {}  # Dask's defaults

    def task(paths: list[str]) -> dict:
        import threading

        texts = _texts([Path(p) for p in paths])
        me, before, c0 = threading.get_native_id(), _threads_cpu(), _cpu()
        n = _encode_all(texts)
        after, process = _threads_cpu(), _cpu() - c0
        # The task's work: its own thread plus the tokenizer's pool, started by this task.
        work = after[me] - before[me] + sum(v for t, v in after.items() if t not in before)
        return {"process_cpu_s": process, "task_cpu_s": work, "tokens": n}

    with cluster.dask_client(1, dashboard_address="127.0.0.1:0") as client:
        return client.submit(task, [str(f) for f in files], pure=False).result()


def _env(parallel: bool) -> dict[str, str]:
    return {**os.environ, "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "true" if parallel else "false", "PYTHONPATH": str(ROOT)}


def _child(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(err[-3000:])
    return json.loads(out.strip().splitlines()[-1])


def measure_pair(paths: list[str], parallel: bool) -> dict:
    procs = [_child(["half", str(h), *paths], _env(parallel)) for h in (0, 1)]
    halves = [_result(p) for p in procs]
    return {"cpu_s": sum(h["cpu_s"] for h in halves),
            "seconds": max(h["seconds"] for h in halves),
            "tokens": sum(h["tokens"] for h in halves)}


def measure_worker(paths: list[str], quiet: bool) -> dict:
    return _result(_child(["worker", "1" if quiet else "0", *paths], _env(True)))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.8))
    tp = results["tokenizer_path"]
    names = ["serial (false)", "1-thread pool (true)"]
    vals = [tp["serial_cpu_s_per_mtok"], tp["pool_cpu_s_per_mtok"]]
    a.bar(names, vals, color=["#777", "#3a7"])
    a.set_ylabel("CPU-s per M tokens (median)")
    a.set_title("tokenizer path, 2 processes x 1 thread")
    hk = results["housekeeping"]
    names = ["Dask defaults", "QUIET_HOUSEKEEPING"]
    vals = [100 * hk["default_share"], 100 * hk["quiet_share"]]
    b.bar(names, vals, color=["#777", "#3a7"])
    b.set_ylabel("worker CPU beyond the task, % (median)")
    b.set_title("Dask worker housekeeping")
    for ax, vs in ((a, [tp["serial_cpu_s_per_mtok"], tp["pool_cpu_s_per_mtok"]]), (b, vals)):
        for i, v in enumerate(vs):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, arg, files = sys.argv[2], int(sys.argv[3]), [Path(p) for p in sys.argv[4:]]
        out = child_half(files, arg) if kind == "half" else child_worker(files, bool(arg))
        print(json.dumps(out))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~3 MB, one run: a smoke test")
    ap.add_argument("--mb", type=int, default=20, help="corpus size in MB")
    ap.add_argument("--runs", type=int, default=3, help="runs per variant (median)")
    args = ap.parse_args()
    mb, runs = (3, 1) if args.quick else (args.mb, args.runs)
    files, _ = build_corpus(mb << 20, CORPUS_DIR / f"{mb}mb")
    paths = [str(f) for f in files]
    raw: dict[str, list[dict]] = {"serial": [], "pool": [], "default": [], "quiet": []}
    for r in range(runs):
        for name, fn in (("serial", lambda: measure_pair(paths, False)),
                         ("pool", lambda: measure_pair(paths, True)),
                         ("default", lambda: measure_worker(paths, False)),
                         ("quiet", lambda: measure_worker(paths, True))):
            raw[name].append(fn())
            print(f"run {r + 1}/{runs} {name:8s} {json.dumps(raw[name][-1])}", flush=True)

    def per_mtok(xs: list[dict]) -> float:
        return median([x["cpu_s"] / x["tokens"] * 1e6 for x in xs])

    def share(xs: list[dict]) -> float:
        return median([(x["process_cpu_s"] - x["task_cpu_s"]) / x["task_cpu_s"] for x in xs])

    tp = {"serial_cpu_s_per_mtok": per_mtok(raw["serial"]),
          "pool_cpu_s_per_mtok": per_mtok(raw["pool"])}
    tp["serial_over_pool"] = tp["serial_cpu_s_per_mtok"] / tp["pool_cpu_s_per_mtok"]
    hk = {"default_share": share(raw["default"]), "quiet_share": share(raw["quiet"])}
    results = {"corpus_mb": mb, "runs": runs, "quick": args.quick, "tokenizer_path": tp,
               "housekeeping": hk, "raw": raw, "machine": machine(),
               "note": "housekeeping share = (worker process CPU - task CPU) / task CPU while "
                       "one task tokenizes; the task's CPU is its thread's and its "
                       "tokenizer pool's (per-thread CPU from /proc)"}
    name = "worker_overhead_quick" if args.quick else "worker_overhead"
    path = write_results(name, results)
    plot(results, RESULTS / f"{name}.png")
    print(f"tokenizer serial path / one-thread pool, CPU per token: {tp['serial_over_pool']:.2f}")
    print(f"Dask housekeeping beside a tokenizing task: {100 * hk['default_share']:.1f} % at "
          f"the defaults, {100 * hk['quiet_share']:.1f} % at QUIET_HOUSEKEEPING")
    print(f"wrote {path} and {name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
