"""Views (``python -m pipeline select``): select's speed and size, and the loader on a view.

One invocation builds a source dataset on local disk (the Shakespeare GPT-2 token stream
repeated to ``--tokens``, documents of 64-2,048 tokens, the pipeline's shard layout with
256 k-token row groups), with two signal columns per document: ``quality.score`` (uniform in
[0, 1)) and ``lang`` (``en`` for half). Then, ``--runs`` interleaved rounds of:

- ``select``: the view ``"quality.score" >= 0.5`` (half the documents, spread over every row
  group: the worst case, every row group kept in part, so each one's token lengths are read
  too) -- documents decided per second, and the view's own bytes as a share of the source's;
- ``select_again``: then ``"quality.score" >= 0.4``, another threshold: the token counts
  the first select cached in the source (``_doclens/``) are read instead of decoded;
- ``select_whole``: the view ``source = 'crawl-0'`` (half the shards, whole: the best case,
  the signal column alone is read) -- documents decided per second;
- ``copy`` (the baseline, in the same round): what a mixer that copies does -- every shard
  read whole, filtered by the same expression, written again (Parquet, zstd) -- documents per
  second and bytes written;
- ``load_source`` / ``load_view``: one epoch of ``build_dataloader(url, 8, 2048)`` (its
  defaults, in-process) over the source and over the view -- delivered tokens per second;
  the claim is the view within 10 % of the source's rate.

Figures are medians over the rounds; the loader ratio is also given as the median of each
round's own ratio. Results: ``benchmarks/results/views.json`` and ``views.png``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, machine, median, shakespeare_tokens, write_results

WHERE = '"quality.score" >= 0.5'
#: half the shards whole (one ``source`` a shard): no row group kept in part, no token read
WHERE_WHOLE = "source = 'crawl-0'"
#: another threshold after ``WHERE``: its token counts come from the source's cache
WHERE_AGAIN = '"quality.score" >= 0.4'
SEQ = 2048
BATCH = 8


def build_source(root: Path, n_tokens: int, seed: int = 0,
                 compression: str = "zstd", cluster_by: str = "") -> dict[str, Any]:
    """The source dataset: the pipeline's shard layout and index, with signal columns;
    ``compression``: the shards' codec (``pipeline.output.shards.SHARD_CODECS``);
    ``cluster_by``: each shard's documents ordered by that column, as ``pipeline run
    --cluster-by`` orders them (:func:`pipeline.output.cluster.clustered`)."""
    import pyarrow as pa

    from pipeline.output.cluster import clustered
    from pipeline.output.shards import ShardWriter, schema_description, shard_table, token_column
    from pipeline.tasks import tokenizing
    from storage import MANIFEST, TOKENIZER, Manifest, ReplicaSet, TokenizerInfo
    from storage.format.index import with_index
    from storage.format.tokens import token_dtype
    from storage.io.index_store import write_index

    rng = np.random.default_rng(seed)
    tokens = np.resize(shakespeare_tokens(), n_tokens)
    cuts = np.cumsum(rng.integers(64, 2049, size=n_tokens // 64))
    docs = np.split(tokens, cuts[cuts < n_tokens])
    tok = tokenizing.gpt2()
    dtype = token_dtype(tok.vocab_size)
    store = ReplicaSet.from_urls([str(root / "web")])
    n_shards = max(2, n_tokens // 16_000_000)
    per = -(-len(docs) // n_shards)
    shards = []
    for i in range(n_shards):
        chunk = docs[i * per:(i + 1) * per]
        table = shard_table([f"bench:{i}:{j}" for j in range(len(chunk))],
                            token_column(chunk, dtype),
                            {"source": pa.array([f"crawl-{i % 2}"] * len(chunk)),
                             "quality.score": pa.array(rng.random(len(chunk))),
                             "lang": pa.array(np.where(rng.random(len(chunk)) < 0.5, "en",
                                                       "de"))})
        if cluster_by:
            table = clustered(table, cluster_by)[0]
        path = f"shards/part-{i:05d}.parquet"
        # schema=None: the table's columns
        with ShardWriter(dtype, 256 * 1024, schema=None, compression=compression) as writer:
            writer.add(table)
            data, info = writer.finish(path)
        store.put(path, data)
        shards.append(info)
    store.put(TOKENIZER, tok.json.encode())
    schema = {**schema_description(dtype), "source": "string", "quality.score": "double",
              "lang": "string"}
    manifest = Manifest(
        tokenizer=TokenizerInfo(tok.name, TOKENIZER, tok.sha256, tok.vocab_size, tok.eos_id,
                                tok.eos_token, len(tok.json.encode())),
        shards=tuple(shards), schema=schema, config={"benchmark": True},
        stats={"signals": {"quality.score": {"type": "double", "step": "quality"}}})
    manifest = with_index(manifest, manifest.shards, write_index(store, manifest.shards))
    store.put(MANIFEST, manifest.to_json().encode())
    return {"url": str(root / "web"), "documents": len(docs), "tokens": n_tokens,
            "shards": len(shards), "row_groups": manifest.counts.row_groups,
            "bytes": manifest.counts.bytes}


def run_select(root: Path, where: str = WHERE, name: str = "web-half",
               cold: bool = True) -> dict[str, Any]:
    """One select into ``name``; ``cold``: without the token counts a select before cached
    in the source (``_doclens/``), so they are decoded."""
    from pipeline.select.build import select
    from storage import ReplicaSet

    dst = root / name
    shutil.rmtree(dst, ignore_errors=True)
    for pin in (root / "web" / "_views").glob("*/*.json"):
        pin.unlink()
    if cold:
        shutil.rmtree(root / "web" / "_doclens", ignore_errors=True)
    t0 = time.perf_counter()
    # the selection itself: its dataset card (documentation, a fixed ~1.6 s of CPU for a
    # sample of the view's columns) is left out, as the filtered copy writes none
    summary = select(ReplicaSet.from_urls([str(root / "web")]), where,
                     ReplicaSet.from_urls([str(dst)]), progress=False, card=False)
    seconds = time.perf_counter() - t0
    own = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    return {"seconds": seconds, "docs_per_s": summary.of_documents / seconds,
            "kept": summary.documents, "of": summary.of_documents,
            "kept_tokens": summary.tokens, "own_bytes": own,
            "own_share": own / summary.source_bytes}


def run_copy(root: Path) -> dict[str, Any]:
    """The baseline: a filtered copy (read every shard, filter, write it again)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out = root / "copy"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    t0 = time.perf_counter()
    docs = written = 0
    for path in sorted((root / "web" / "shards").glob("*.parquet")):
        table = pq.read_table(path)
        docs += table.num_rows
        kept = table.filter(pc.greater_equal(table.column("quality.score"), 0.5))
        pq.write_table(kept, out / path.name, compression="zstd")
        written += (out / path.name).stat().st_size
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "docs_per_s": docs / seconds, "bytes_written": written}


def run_load(url: str) -> dict[str, Any]:
    from loaders import build_dataloader

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    loader = build_dataloader(url, BATCH, SEQ, rank=0, world_size=1)
    n = 0
    for batch in loader:
        n += int(batch["input_ids"].numel())
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": n, "tokens_per_s": n / seconds,
            "cpu_s": time.process_time() - cpu0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="5 M tokens, 2 runs")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.runs = 5_000_000, 2
    root = Path(args.workdir or tempfile.mkdtemp(prefix="views-bench-"))
    shutil.rmtree(root / "web", ignore_errors=True)
    t0 = time.perf_counter()
    source = build_source(root, args.tokens)
    print(f"source: {source['documents']:,} documents, {source['tokens']:,} tokens, "
          f"{source['row_groups']:,} row groups, {source['bytes'] / 1e6:.1f} MB "
          f"(built in {time.perf_counter() - t0:.0f} s)")
    rounds: list[dict[str, Any]] = []
    for r in range(args.runs):
        sel = run_select(root)
        again = run_select(root, WHERE_AGAIN, "web-again", cold=False)
        whole = run_select(root, WHERE_WHOLE, "web-whole")
        copy = run_copy(root)
        order = ("source", "view") if r % 2 == 0 else ("view", "source")
        loads = {k: run_load(str(root / ("web" if k == "source" else "web-half")))
                 for k in order}
        rounds.append({"select": sel, "select_again": again, "select_whole": whole,
                       "copy": copy,
                       "load_source": loads["source"], "load_view": loads["view"],
                       "load_ratio": loads["view"]["tokens_per_s"]
                       / loads["source"]["tokens_per_s"]})
        print(f"round {r + 1}: select {sel['docs_per_s']:,.0f} docs/s (another threshold "
              f"after it {again['docs_per_s']:,.0f}, whole row groups "
              f"{whole['docs_per_s']:,.0f}), copy "
              f"{copy['docs_per_s']:,.0f} docs/s, view's own bytes {sel['own_share']:.4%}; "
              f"load source {loads['source']['tokens_per_s'] / 1e6:.1f} M tok/s, view "
              f"{loads['view']['tokens_per_s'] / 1e6:.1f} M tok/s "
              f"({rounds[-1]['load_ratio']:.3f}x)")

    def med(part: str, key: str) -> float:
        return median([x[part][key] for x in rounds])

    summary = {
        "select_docs_per_s": med("select", "docs_per_s"),
        "copy_docs_per_s": med("copy", "docs_per_s"),
        "select_vs_copy": med("select", "docs_per_s") / med("copy", "docs_per_s"),
        "select_again_docs_per_s": med("select_again", "docs_per_s"),
        "select_again_vs_copy": med("select_again", "docs_per_s") / med("copy", "docs_per_s"),
        "select_whole_docs_per_s": med("select_whole", "docs_per_s"),
        "select_whole_vs_copy": med("select_whole", "docs_per_s") / med("copy", "docs_per_s"),
        "view_own_bytes": rounds[-1]["select"]["own_bytes"],
        "view_own_share": rounds[-1]["select"]["own_share"],
        "copy_bytes_share": rounds[-1]["copy"]["bytes_written"] / source["bytes"],
        "kept_documents_share": rounds[-1]["select"]["kept"] / rounds[-1]["select"]["of"],
        "kept_tokens_share": rounds[-1]["select"]["kept_tokens"] / source["tokens"],
        "load_source_tokens_per_s": med("load_source", "tokens_per_s"),
        "load_view_tokens_per_s": med("load_view", "tokens_per_s"),
        "load_view_vs_source": med("load_view", "tokens_per_s")
        / med("load_source", "tokens_per_s"),
        "load_ratio_within_rounds_median": median([x["load_ratio"] for x in rounds]),
    }
    print("\nmedians over", args.runs, "rounds:")
    print(f"  select      {summary['select_docs_per_s']:>12,.0f} docs/s  "
          f"({summary['select_vs_copy']:.2f}x a filtered copy's "
          f"{summary['copy_docs_per_s']:,.0f})")
    print(f"  select      {summary['select_again_docs_per_s']:>12,.0f} docs/s  "
          f"({summary['select_again_vs_copy']:.2f}x) another threshold after it: token counts "
          "from the source's cache")
    print(f"  select      {summary['select_whole_docs_per_s']:>12,.0f} docs/s  "
          f"({summary['select_whole_vs_copy']:.2f}x) where whole row groups are kept or not: "
          "signal columns only")
    print(f"  view bytes  {summary['view_own_bytes']:>12,} ({summary['view_own_share']:.4%} of "
          f"the source; the copy wrote {summary['copy_bytes_share']:.1%})")
    print(f"  loader      view {summary['load_view_tokens_per_s'] / 1e6:.2f} M tok/s vs source "
          f"{summary['load_source_tokens_per_s'] / 1e6:.2f} M tok/s: "
          f"{summary['load_view_vs_source']:.3f}x (median of rounds' ratios "
          f"{summary['load_ratio_within_rounds_median']:.3f}x)")
    name = "views_quick" if args.quick else "views"
    results = {"source": source, "where": WHERE, "runs": args.runs, "rounds": rounds,
               "summary": summary, "machine": machine()}
    path = write_results(name, results)
    plot(summary, rounds, RESULTS / f"{name}.png")
    print(f"wrote {path}")
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def plot(summary: dict[str, Any], rounds: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(["select\n50 % of docs", "again\n(cached)", "select\n50 % of shards",
           "filtered\ncopy"],
          [summary["select_docs_per_s"], summary["select_again_docs_per_s"],
           summary["select_whole_docs_per_s"], summary["copy_docs_per_s"]],
          color=["C0", "C2", "C1", "C7"])
    a.set_ylabel("documents decided per second")
    a.set_title(f"50 % selection; view's own bytes {summary['view_own_share']:.3%} of source")
    b.plot([x["load_source"]["tokens_per_s"] / 1e6 for x in rounds], "o-", label="source")
    b.plot([x["load_view"]["tokens_per_s"] / 1e6 for x in rounds], "s-", label="50 % view")
    b.set_xlabel("round")
    b.set_ylabel("loader M tokens/s")
    b.set_title(f"loader: view {summary['load_view_vs_source']:.2f}x the source's rate")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
