"""Steps and recipes: what the step interface costs, and what signals cost.

The same work as ``benchmarks/pipeline_throughput.py``'s ``phase1_plain`` (its corpus: real
English text, ~8 paragraphs a document; the pipeline's phase-1 tasks, parse -> steps -> dedup
keys -> tokenize -> shard, one process, no Dask), each in a fresh child process, alternating,
medians over ``--runs``:

* ``before``: the code before steps existed (``--before``, default the commit before them,
  checked out into a temporary git worktree and run from there): the fixed cleaner;
* ``default``: this code's default recipe (the same cleaner as a step, through the chain);
* ``annotate_rules``: the default recipe plus the four rule sets in annotate mode
  (``--annotate gopher,c4,fineweb``): every measure they compare written as a column.

It prints and writes (``benchmarks/results/step_recipes.json`` and ``.png``): tokens/s and CPU
seconds of each, the ratio ``default / before`` of tokens per CPU second (the claim: within
5 %; CPU time, because the wall time of a ~3 s task on a shared 2-core machine swings by
+-30 %), the CPU seconds per million tokens that annotating everything adds, and the bytes per
document its signal columns add to the shards. Beside them, in this process, the steps alone:
the cleaner called directly (what phase 1 did before) against the same cleaner through the
step chain, microseconds per document, interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import ROOT, write_results  # noqa: E402
from benchmarks.pipeline_throughput import build_corpus  # noqa: E402

#: the last commit before the step interface (pipeline/steps/)
BEFORE = "f923cc7"

#: run as ``python -c`` with PYTHONPATH set to the tree under test, so that the same code runs
#: against the old and the new pipeline; prints one JSON line
CHILD = r"""
import json, resource, shutil, sys, tempfile, time
from dataclasses import replace
from pathlib import Path

from pipeline.config import PipelineConfig
from storage import tokenizer_name
try:  # pipeline/ by concern (planning/, tasks/)
    from pipeline.planning.discovery import discover
    from pipeline.planning.plan import auto_partition_bytes, plan_partitions
    from pipeline.tasks import tokenizing
    from pipeline.tasks.stages import StageParams, phase_one
except ImportError:  # the flat pipeline/ of before (the --before worktree)
    from pipeline import tokenizing
    from pipeline.discovery import discover
    from pipeline.plan import auto_partition_bytes, plan_partitions
    from pipeline.stages import StageParams, phase_one

kind, files = sys.argv[1], sys.argv[2:]
out = Path(tempfile.mkdtemp(prefix="bench-steps-"))
try:
    more = {"annotate": "gopher,c4,fineweb"} if kind == "annotate_rules" else {}
    cfg = PipelineConfig(inputs=files, output=str(out), workers=1, **more)
    found = discover(cfg.inputs)
    cfg = replace(cfg, partition_bytes=auto_partition_bytes(sum(f.size for f in found)))
    parts = plan_partitions(found, cfg.partition_bytes)
    tok = tokenizing.load(cfg.tokenizer, cfg.eos_token)
    store = cfg.output_store()
    store.put(tokenizer_name(tok.sha256), tok.json.encode("utf-8"))
    extra = {"recipe": cfg.recipe} if kind == "annotate_rules" else {}
    params = StageParams(cfg.read_options, cfg.cleaning, cfg.dedup == "exact", cfg.near_dup,
                         (cfg.minhash_perms, cfg.minhash_bands, cfg.shingle_words,
                          cfg.minhash_rows), tok.sha256, tok.vocab_size, tok.eos_id,
                         cfg.encode_batch_docs, cfg.row_group_tokens, cfg.strict,
                         cfg.storage_options, **extra)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    ones = [phase_one(p, f"bench-{p.index:05d}", store, params) for p in parts]
    seconds = time.perf_counter() - t
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "seconds": seconds,
        "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
        "tokens": sum(o.tokens for o in ones), "docs": sum(o.rows for o in ones),
        "shard_bytes": sum(o.shard.bytes for o in ones if o.shard is not None),
        "columns": sorted({c for o in ones for c in getattr(o, "signals", {})})}))
finally:
    shutil.rmtree(out, ignore_errors=True)
"""


def worktree(commit: str) -> Path:
    """``commit`` checked out (detached) beside the repository, for the ``before`` runs."""
    path = Path(tempfile.gettempdir()) / f"shardflow-before-{commit}"
    if not (path / "pipeline").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), commit], cwd=ROOT,
                       check=True, capture_output=True)
    return path


def child(tree: Path, kind: str, files: list[Path]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "RAYON_NUM_THREADS": "1",
           "FASTOKENS_BPE_THREADS": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "true"}
    out = subprocess.run([sys.executable, "-c", CHILD, kind, *map(str, files)], env=env,
                         cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} in {tree} failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]),
            "load": round(os.getloadavg()[0], 2)}


def steps_alone(files: list[Path], rounds: int = 7, n: int = 5000) -> dict:
    """Microseconds per document of the cleaner called directly and through the chain (with
    its column gatherer), on the corpus's first ``n`` documents; medians of ``rounds``."""
    import time

    from pipeline.cleaning import Cleaner, CleaningConfig
    from pipeline.records import Document
    from pipeline.steps.chain import StepChain
    from pipeline.steps.shorthand import recipe_of

    docs = []
    with open(files[0], encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            docs.append(Document(d["id"], d["text"]))
            if len(docs) == n:
                break
    cleaner, chain = Cleaner(), StepChain(recipe_of(CleaningConfig()))
    columns = chain.columns()
    direct, chained = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        for d in docs:
            cleaner(d.text)
        direct.append((time.perf_counter() - t) / len(docs) * 1e6)
        t = time.perf_counter()
        for d in docs:
            if chain(d) is not None:
                columns.add(*chain.last)
        columns.take()
        chained.append((time.perf_counter() - t) / len(docs) * 1e6)
    return {"cleaner_us_per_doc": statistics.median(direct),
            "chain_us_per_doc": statistics.median(chained),
            "chars_per_doc": sum(len(d.text) for d in docs) / len(docs)}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["median_tokens_per_s"])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    values = [results["median_tokens_per_s"][n] / 1e3 for n in names]
    bars = ax.bar(names, values, color=["#999", "#3a7", "#58b"][:len(names)])
    for bar, n in zip(bars, names, strict=True):
        ax.annotate(f"{results['median_tokens_per_s'][n] / 1e3:,.0f}k",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                    va="bottom", fontsize=9)
    ax.set_ylabel("phase 1, k tokens/s (one process)")
    ax.set_title(f"default / before (tokens per CPU s) = "
                 f"{results['default_over_before']:.3f}; annotate "
                 f"+{results['annotate_cpu_s_per_m_tokens']:.1f} CPU s per M tokens, "
                 f"+{results['annotate_bytes_per_doc']:.0f} B/doc", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=30, help="corpus size in MB")
    ap.add_argument("--runs", type=int, default=5, help="runs per method (median)")
    ap.add_argument("--before", default=BEFORE, help="the commit to compare against")
    ap.add_argument("--quick", action="store_true", help="~4 MB, one run: a smoke test")
    args = ap.parse_args()
    mb, runs = (4, 1) if args.quick else (args.mb, args.runs)
    corpus = Path(tempfile.gettempdir()) / "shardflow-bench-corpus" / f"{mb}mb"
    files, n_docs = build_corpus(mb << 20, corpus)
    before = worktree(args.before)
    trees = {"before": before, "default": ROOT, "annotate_rules": ROOT}
    samples: dict[str, list[dict]] = {k: [] for k in trees}
    try:
        for run in range(runs):
            for kind, tree in trees.items():  # alternating: drift on a shared machine
                r = child(tree, kind if kind != "before" else "default", files)
                samples[kind].append(r)
                print(f"run {run + 1}/{runs} {kind:15s} {r['tokens'] / r['seconds']:>12,.0f} "
                      f"tokens/s  cpu {r['cpu_s']:.1f} s  load {r['load']}", flush=True)
    finally:
        if not args.quick:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT,
                           check=False, capture_output=True)
    med = {k: statistics.median(r["tokens"] / r["seconds"] for r in v)
           for k, v in samples.items()}
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in samples.items()}
    tokens = samples["default"][0]["tokens"]
    per_cpu = {k: statistics.median(r["tokens"] / r["cpu_s"] for r in v)
               for k, v in samples.items()}
    assert all(r["tokens"] == tokens for k in ("before", "default") for r in samples[k]), \
        "before and default must tokenize the same documents"
    docs = samples["annotate_rules"][0]["docs"]
    results = {
        "corpus_mb": mb, "documents": n_docs, "runs": runs, "before": args.before,
        "tokens": tokens, "median_tokens_per_s": med, "median_cpu_s": cpu,
        "median_tokens_per_cpu_s": per_cpu,
        "default_over_before": per_cpu["default"] / per_cpu["before"],
        "default_over_before_wall": med["default"] / med["before"],
        "steps_alone": steps_alone(files),
        "annotate_cpu_s_per_m_tokens": (cpu["annotate_rules"] - cpu["default"])
        / (tokens / 1e6),
        "annotate_over_default": med["annotate_rules"] / med["default"],
        "annotate_bytes_per_doc": (samples["annotate_rules"][0]["shard_bytes"]
                                   - samples["default"][0]["shard_bytes"]) / max(1, docs),
        "annotate_columns": samples["annotate_rules"][0]["columns"],
        "samples": samples,
    }
    print(f"default recipe / before: {results['default_over_before']:.3f} in tokens per CPU "
          f"second ({per_cpu['default']:,.0f} vs {per_cpu['before']:,.0f}), "
          f"{results['default_over_before_wall']:.3f} in wall time ({med['default']:,.0f} vs "
          f"{med['before']:,.0f} tokens/s), medians of {runs}")
    alone = results["steps_alone"]
    print(f"the cleaner alone: {alone['cleaner_us_per_doc']:.1f} us/doc called directly, "
          f"{alone['chain_us_per_doc']:.1f} us/doc through the step chain "
          f"({alone['chars_per_doc']:,.0f} characters a document)")
    print(f"annotate gopher,c4,fineweb: {results['annotate_over_default']:.3f}x the default's "
          f"speed, +{results['annotate_cpu_s_per_m_tokens']:.1f} CPU s per M tokens, "
          f"{len(results['annotate_columns'])} columns, "
          f"+{results['annotate_bytes_per_doc']:.0f} shard bytes per document")
    if not args.quick:
        path = write_results("step_recipes", results)
        plot(results, path.with_suffix(".png"))
        print(f"wrote {path} and {path.with_suffix('.png')}")
    shutil.rmtree(Path(tempfile.gettempdir()) / "bench-steps", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
