"""Decontamination's eval index: its memory at 1 M eval n-grams, and the cost of a lookup.

Eval examples of 100 random words (a 50 k-word vocabulary: every 13-gram distinct, the worst
case for memory) are indexed until they give ``--ngrams`` n-grams (1 M by default). Measured in
the same run, each in a fresh process (``ru_maxrss`` and ``tracemalloc`` are then its own):

* ``sorted_arrays``: :class:`pipeline.steps.ngrams.EvalIndex`, what each worker process holds:
  sorted uint64 hashes and uint32 example ids (12 bytes a pair) plus each example's count;
* ``python_set``: the same hashes as a Python ``set`` of ints, the obvious structure (it
  cannot say which example an n-gram came from, which ``min_overlap`` needs);
* ``python_dict``: hash -> example as a Python ``dict``, the set's equal in what it can answer.

Memory is ``tracemalloc``'s bytes held by the structure once built (the texts freed). Lookups:
documents of 1,000 words (a tenth of them holding one eval passage) through
``EvalIndex.match`` against the same n-gram hashes looked up in the set one by one; both give
the same hit counts (checked). Prints, writes ``benchmarks/results/decontamination.json`` and
``.png``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import ROOT, median, write_results  # noqa: E402

WORDS_PER_EXAMPLE = 100
N = 13


def _vocab(k: int, rnd: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return list(dict.fromkeys("".join(rnd.choices(letters, k=rnd.randint(3, 9)))
                              for _ in range(k * 2)))[:k]


def _examples(ngrams: int, seed: int = 1) -> tuple[list[str], list[str]]:
    rnd = random.Random(seed)
    vocab = _vocab(50_000, rnd)
    per = WORDS_PER_EXAMPLE - N + 1
    texts = [" ".join(rnd.choices(vocab, k=WORDS_PER_EXAMPLE))
             for _ in range(-(-ngrams // per))]
    return texts, vocab


def _child(kind: str, ngrams: int, docs: int) -> dict:
    """One structure built and measured in this (fresh) process."""
    import resource

    import numpy as np

    from pipeline.steps.ngrams import EvalIndex, _word_hash, ngram_hashes, words

    texts, vocab = _examples(ngrams)
    tracemalloc.start()
    t0 = time.perf_counter()
    index = EvalIndex([("eval", texts)], N)
    build_s = time.perf_counter() - t0
    n_grams = len(index.hashes)
    hashes = index.hashes
    if kind == "sorted_arrays":
        held: object = index
    elif kind == "python_set":
        held = set(hashes.tolist())
    else:
        held = dict(zip(hashes.tolist(), index.examples.tolist(), strict=True))
    if kind != "sorted_arrays":
        del index
    del texts
    _word_hash.cache_clear()  # the word-hash cache (ngrams.WORD_CACHE) is not the index's
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    if kind != "sorted_arrays":  # the hashes array was only the way in
        current -= hashes.nbytes
    tracemalloc.stop()
    del hashes
    # lookups: documents of 1,000 words, every tenth holding a passage of an eval example
    rnd = random.Random(2)
    source, _ = _examples(ngrams)
    documents = []
    for i in range(docs):
        ws = rnd.choices(vocab, k=1000)
        if i % 10 == 0:
            ws[400:400 + 30] = rnd.choice(source).split()[:30]
        documents.append(ws)
    t0 = time.perf_counter()
    hits = []
    if kind == "sorted_arrays":
        for ws in documents:
            hits.append(held.match(ws).hits)  # type: ignore[attr-defined]
    else:
        for ws in documents:
            doc = np.unique(ngram_hashes(words(" ".join(ws)), N))
            hits.append(sum(1 for h in doc.tolist() if h in held))  # type: ignore[operator]
    lookup_s = time.perf_counter() - t0
    return {"kind": kind, "ngrams": n_grams, "bytes": int(current), "build_s": build_s,
            "lookup_docs_per_s": docs / lookup_s, "hits": hits,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


KINDS = ("sorted_arrays", "python_set", "python_dict")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ngrams", type=int, default=1_000_000)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.ngrams, args.docs)))
        return
    if args.quick:
        args.ngrams, args.docs, args.runs = 50_000, 200, 1
    rounds: dict[str, list[dict]] = {k: [] for k in KINDS}
    for _ in range(args.runs):
        for kind in KINDS:  # interleaved
            out = subprocess.run([sys.executable, __file__, "--child", kind, "--ngrams",
                                  str(args.ngrams), "--docs", str(args.docs)],
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            rounds[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    hits = {k: rounds[k][0]["hits"] for k in KINDS}
    assert hits["sorted_arrays"] == hits["python_set"] == hits["python_dict"], "hits differ"
    assert sum(1 for h in hits["sorted_arrays"] if h) >= args.docs // 10
    summary = {}
    for kind in KINDS:
        rs = rounds[kind]
        summary[kind] = {"ngrams": rs[0]["ngrams"],
                         "mb": median([r["bytes"] for r in rs]) / 2**20,
                         "bytes_per_ngram": median([r["bytes"] for r in rs]) / rs[0]["ngrams"],
                         "build_s": median([r["build_s"] for r in rs]),
                         "lookup_docs_per_s": median([r["lookup_docs_per_s"] for r in rs]),
                         "max_rss_mb": median([r["max_rss_mb"] for r in rs])}
    base = summary["sorted_arrays"]
    for kind in KINDS:
        s = summary[kind]
        s["memory_vs_arrays"] = s["mb"] / base["mb"]
        print(f"{kind:14s} {s['ngrams']:>9,} n-grams  {s['mb']:7.1f} MB "
              f"({s['bytes_per_ngram']:5.1f} B/n-gram, {s['memory_vs_arrays']:4.1f}x)  "
              f"lookup {s['lookup_docs_per_s']:7,.0f} docs/s of 1,000 words  "
              f"(index built in {s['build_s']:.1f} s)")
    name = "decontamination_quick" if args.quick else "decontamination"
    path = write_results(name, {"args": vars(args), "summary": summary,
                                "rounds": {k: [{kk: v for kk, v in r.items() if kk != "hits"}
                                               for r in rs] for k, rs in rounds.items()}})
    _plot(summary, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


def _plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(summary)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(kinds, [summary[k]["mb"] for k in kinds], color=["tab:green", "tab:gray", "tab:gray"])
    a.set_ylabel("MB held")
    a.set_title(f"eval index of {summary[kinds[0]]['ngrams']:,} 13-grams")
    b.bar(kinds, [summary[k]["lookup_docs_per_s"] for k in kinds],
          color=["tab:green", "tab:gray", "tab:gray"])
    b.set_ylabel("documents/s (1,000 words each)")
    b.set_title("lookup (normalise, hash, match)")
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
