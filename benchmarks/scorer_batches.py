"""Model scorers: what a step's batch method buys.

A fastText classifier (trained here, DCLM's settings: supervised, word bigrams, on this
benchmark's corpus: ``pipeline_throughput``'s real English documents, ~8 paragraphs each,
labelled by a word's presence so the model has something to learn) scores the same documents
through the step chain two ways, interleaved, medians over ``--runs`` rounds:

* ``per_document``: the step's ``__call__`` on one document at a time (what a step without a
  ``batch`` method gets);
* ``batched``: :meth:`pipeline.steps.chain.StepChain.run` on groups of
  :data:`pipeline.tasks.record_steps.BATCH_DOCS` documents, which hands the step's ``batch``
  method the whole group (one ``predict`` call into fastText's C++ for all of them).

It prints and writes ``benchmarks/results/scorer_batches.json`` and ``.png``: documents/s of
each, and the ratio ``batched / per_document`` measured in the same run. The scores are checked
equal both ways before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import ROOT, write_results  # noqa: E402
from benchmarks.pipeline_throughput import build_corpus  # noqa: E402


def _documents(n: int, root: Path) -> list[str]:
    files, _ = build_corpus(max(4 << 20, n * 6000), root / "corpus")
    texts: list[str] = []
    for path in files:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                texts.append(json.loads(line)["text"])
                if len(texts) == n:
                    return texts
    return texts


def _model(texts: list[str], root: Path) -> str:
    import fasttext

    train = root / "train.txt"
    with open(train, "w", encoding="utf-8") as fh:
        for text in texts:
            label = "hq" if " love " in text else "lq"
            fh.write(f"__label__{label} {text.replace(chr(10), ' ')}\n")
    model = fasttext.train_supervised(str(train), epoch=3, lr=0.1, dim=64, wordNgrams=2,
                                      minCount=2, thread=1, seed=1, verbose=0)
    path = root / "model.bin"
    model.save_model(str(path))
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=8000, help="documents scored per round")
    ap.add_argument("--runs", type=int, default=5, help="interleaved rounds (medians)")
    ap.add_argument("--quick", action="store_true", help="1,000 documents, 3 rounds; "
                    "results go to scorer_batches_quick.*")
    args = ap.parse_args()
    if args.quick:
        args.docs, args.runs = 1000, 3

    from pipeline.records import Document
    from pipeline.steps.chain import StepChain
    from pipeline.steps.recipe import Recipe, spec
    from pipeline.tasks.record_steps import BATCH_DOCS

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = _documents(args.docs, ROOT / "data" / "bench_corpus_scorers")
        model = _model(texts, root)
        chain = StepChain(Recipe((spec("fasttext", "dclm", model=model),)))
        docs = [Document(f"d{i}", t) for i, t in enumerate(texts)]

        def per_document() -> list[dict]:
            out = []
            for d in docs:
                chain(d)
                out.append(chain.last[1])
            return out

        def batched() -> list[dict]:
            out = []
            for i in range(0, len(docs), BATCH_DOCS):
                for outcome in chain.run(docs[i:i + BATCH_DOCS]):
                    chain.settle(outcome)
                    out.append(outcome.row[1])
            return out

        assert per_document() == batched(), "the batch scores differ from one at a time"
        rates: dict[str, list[float]] = {"per_document": [], "batched": []}
        for _ in range(args.runs):
            for name, fn in (("per_document", per_document), ("batched", batched)):
                start = time.perf_counter()
                fn()
                rates[name].append(len(docs) / (time.perf_counter() - start))
        chain.close()

    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["batched"] / med["per_document"]
    mean_chars = sum(len(t) for t in texts) / len(texts)
    print(f"fastText scorer, {len(docs)} documents of {mean_chars:,.0f} characters, "
          f"{args.runs} rounds (medians):")
    for name, value in med.items():
        print(f"  {name:13s} {value:10,.0f} docs/s")
    print(f"  batched / per_document: {ratio:.2f}x (batches of {BATCH_DOCS})")
    name = "scorer_batches_quick" if args.quick else "scorer_batches"
    path = write_results(name, {
        "docs": len(docs), "mean_chars": mean_chars, "runs": args.runs,
        "batch_docs": BATCH_DOCS, "docs_per_s": rates, "median_docs_per_s": med,
        "ratio_batched_over_per_document": ratio})
    _plot(rates, ratio, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


def _plot(rates: dict[str, list[float]], ratio: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    names = list(rates)
    meds = [statistics.median(rates[n]) for n in names]
    ax.bar(names, meds, color=["#999999", "#3b7dd8"])
    for i, n in enumerate(names):
        ax.scatter([i] * len(rates[n]), rates[n], color="black", s=8, zorder=3)
    ax.set_ylabel("documents / s (fastText step)")
    ax.set_title(f"a scorer's batch method: {ratio:.2f}x")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
