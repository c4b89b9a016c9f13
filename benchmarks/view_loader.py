"""The loader on a view: a view that keeps half the documents, tokens/s against its source's.

The claim (issue 45, part 2): ``build_dataloader`` on a view that keeps half the documents
delivers within 10 % of its source dataset's tokens per second.

One invocation builds the source of ``benchmarks/views.py`` on local disk (the Shakespeare
GPT-2 ids repeated to ``--tokens``, documents of 64-2,048 tokens, the pipeline's shards with
256 k-token row groups, each row group's token chunk one zstd page) and, with ``select``, its
view ``"quality.score" >= 0.5``: half the documents, at random, so every row group keeps about
half of its own (the worst case for the loader). Then ``--runs`` rounds (the order of source
and view alternating) of:

- ``load``: ``--epochs`` pairs of one epoch of ``build_dataloader(url, 8, 2048)`` (its
  defaults: in-process, 2 read threads), source and view in turn, a fresh loader each (an
  epoch of 100 M tokens takes well under a second, so a single pair is at the mercy of the
  machine's other load) -- delivered tokens per second, and CPU seconds of all the process's
  threads per billion tokens;
- ``--view-read-threads N``: each pair also loads the view with ``N`` read threads (the
  loader's default is 2): more decode threads, for the view's doubled decode per token;
- ``pages``: could a view skip what it drops? A few row groups' token column written again
  with smaller data pages: bytes and decode time against the writer's pages;
- ``process``: one epoch of each as its own job (``python -c``), timed from the process's
  start to its exit: the interpreter, the imports and opening the dataset (a view's masks,
  its index, its source's) included, as a user's training job pays them;
- ``read``: why -- every row group of each fetched, verified and decoded once on this thread
  (``TokenReader.fetch_groups``, what the read threads do): CPU per row group and the tokens
  it yields. A view decodes each row group whole for the half it keeps.

``--shard-compression lz4`` or ``none`` builds the source with that codec (a row group's
decode then costs less: the cost a view doubles per token). Figures are medians: each round's
of its epochs, then over the rounds; the ratio is also given as the median of every epoch
pair's own ratio. Results: ``benchmarks/results/view_loader.json`` and ``view_loader.png``
(``view_loader_lz4``, ``view_loader_none`` for the other codecs).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.bench_utils import RESULTS, machine, median, write_results
from benchmarks.views import BATCH, SEQ, WHERE, build_source, run_select

NAMES = {"source": "web", "view": "web-half"}


def run_load(url: str, **settings: Any) -> dict[str, Any]:
    """One epoch of the loader's defaults (or ``settings``) over ``url``: rate, and CPU of
    every thread."""
    from loaders import build_dataloader

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    n = 0
    for batch in build_dataloader(url, BATCH, SEQ, rank=0, world_size=1, **settings):
        n += int(batch["input_ids"].numel())
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return {"seconds": seconds, "tokens": n, "tokens_per_s": n / seconds, "cpu_s": cpu,
            "cpu_s_per_gtok": cpu / n * 1e9}


#: a user's job reading one epoch: the process started, loaders imported, the dataset opened
#: (for a view: its masks, its index and its source's), every batch read, the process ended
EPOCH_JOB = """
import sys
from loaders import build_dataloader
n = 0
for batch in build_dataloader(sys.argv[1], {batch}, {seq}, rank=0, world_size=1):
    n += int(batch["input_ids"].numel())
print(n)
"""


def run_process(url: str) -> dict[str, Any]:
    """One epoch as its own process, timed from its start to its end (what a training job's
    data costs on its own clock: the interpreter, imports and opening the dataset included)."""
    code = EPOCH_JOB.format(batch=BATCH, seq=SEQ)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, url], check=True, capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1]).stdout
    seconds = time.perf_counter() - t0
    n = int(out.split()[-1])
    return {"seconds": seconds, "tokens": n, "tokens_per_s": n / seconds}


def run_read(url: str) -> dict[str, Any]:
    """Every row group of ``url`` that holds tokens fetched, verified and decoded (a view's:
    masked) once, on this thread: CPU per row group, and the tokens it delivers."""
    from loaders.settings import LoaderSettings
    from loaders.source import DatasetSource

    reader = DatasetSource(url, LoaderSettings.from_kwargs(SEQ)).reader
    # the row groups the loader reads: a view's that keep something (it never fetches the
    # others: no sample lies in them)
    used = np.flatnonzero(np.diff(reader.index.starts) > 0).tolist()
    n = len(used)
    reader.fetch_groups(used[:1])  # the index's read columns, the shard's footer and mapping
    cpu0 = time.thread_time()
    tokens = sum(len(arr) for g in used for arr in reader.fetch_groups([g]).values())
    cpu = time.thread_time() - cpu0
    return {"row_groups": n, "cpu_s": cpu, "us_per_group": cpu / n * 1e6,
            "tokens_per_group": tokens / n, "cpu_s_per_gtok": cpu / tokens * 1e9}


#: data page sizes tried for ``pages``: the writer's (1 MiB: one page a row group's token
#: chunk), smaller, and one document a page (the only size at which a view keeping documents
#: at random could skip pages)
PAGE_SIZES = {"1 MiB (the writer's)": (1 << 20, 1024), "64 KiB": (64 << 10, 1),
              "8 KiB": (8 << 10, 1), "a document": (1, 1)}


def run_pages(root: Path, codec: str = "zstd", groups: int = 8) -> dict[str, Any]:
    """Could a view skip the pages it keeps nothing of? ``groups`` row groups of the first
    shard's token column written again (``codec``, the shards', at the writer's level) at each
    of :data:`PAGE_SIZES`: bytes and decode time per row group, against the writer's pages."""
    import io

    import pyarrow.parquet as pq

    from pipeline.output.shards import SHARD_CODECS

    first = sorted((root / NAMES["source"] / "shards").glob("*.parquet"))[0]
    shard = pq.ParquetFile(first)
    tables = [shard.read_row_group(g, columns=["input_ids"]) for g in range(groups)]
    out: dict[str, Any] = {}
    for name, (page, batch) in PAGE_SIZES.items():
        buf = io.BytesIO()
        with pq.ParquetWriter(buf, tables[0].schema, compression=codec,
                              compression_level=SHARD_CODECS[codec], use_dictionary=False,
                              data_page_size=page, write_batch_size=batch,
                              write_statistics=False) as writer:
            for t in tables:
                writer.write_table(t, row_group_size=t.num_rows)
        f = pq.ParquetFile(io.BytesIO(buf.getvalue()))
        size = sum(f.metadata.row_group(g).column(0).total_compressed_size
                   for g in range(groups))
        times = []
        for _ in range(5):
            t0 = time.thread_time()
            for g in range(groups):
                f.read_row_group(g, use_threads=False)
            times.append((time.thread_time() - t0) / groups)
        out[name] = {"bytes_per_group": size / groups, "decode_us_per_group": median(times) * 1e6,
                     "documents_per_group": tables[0].num_rows}
    base = out[next(iter(PAGE_SIZES))]
    for v in out.values():
        v["bytes_vs_writer"] = v["bytes_per_group"] / base["bytes_per_group"]
        v["decode_vs_writer"] = v["decode_us_per_group"] / base["decode_us_per_group"]
    return out


def run_round(root: Path, r: int, epochs: int, view_threads: int = 0) -> dict[str, Any]:
    """``epochs`` loader pairs and one read of each, the order alternating with ``r``;
    ``view_threads``: each pair also loads the view with that many read threads."""
    order = ("source", "view") if r % 2 == 0 else ("view", "source")
    pairs = []
    for _ in range(epochs):
        pair = {k: run_load(str(root / NAMES[k])) for k in order}
        if view_threads:
            pair["view_threads"] = run_load(str(root / NAMES["view"]),
                                            read_threads=view_threads)
        pairs.append(pair)
    reads = {k: run_read(str(root / NAMES[k])) for k in order}
    processes = {k: run_process(str(root / NAMES[k])) for k in order}
    out: dict[str, Any] = {"pairs": pairs, "processes": processes,
                           "process_ratio": processes["view"]["tokens_per_s"]
                           / processes["source"]["tokens_per_s"]}
    for k in order:
        out[f"load_{k}"] = {f: median([p[k][f] for p in pairs]) for f in pairs[0][k]}
        out[f"read_{k}"] = reads[k]
    out["ratios"] = [p["view"]["tokens_per_s"] / p["source"]["tokens_per_s"] for p in pairs]
    if view_threads:
        out["load_view_threads"] = {f: median([p["view_threads"][f] for p in pairs])
                                    for f in pairs[0]["view_threads"]}
    return out


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(part: str, key: str) -> float:
        return median([x[part][key] for x in rounds])

    s = {f"{part}_{k}_{key}": med(f"{part}_{k}", key)
         for part, keys in (("load", ("tokens_per_s", "cpu_s_per_gtok")),
                            ("read", ("us_per_group", "tokens_per_group", "cpu_s_per_gtok")))
         for k in ("source", "view") for key in keys}
    s["ratio"] = s["load_view_tokens_per_s"] / s["load_source_tokens_per_s"]
    s["ratio_of_pairs_median"] = median([q for x in rounds for q in x["ratios"]])
    s["ratio_of_rounds"] = [median(x["ratios"]) for x in rounds]
    s["cpu_per_token_view_vs_source"] = (s["load_view_cpu_s_per_gtok"]
                                         / s["load_source_cpu_s_per_gtok"])
    s["read_cpu_per_group_view_vs_source"] = (s["read_view_us_per_group"]
                                              / s["read_source_us_per_group"])
    s["claim_met"] = s["ratio"] >= 0.9 and s["ratio_of_pairs_median"] >= 0.9
    # the same epochs timed from each process's start (interpreter, imports, opening included)
    s["process_source_seconds"] = median([x["processes"]["source"]["seconds"] for x in rounds])
    s["process_view_seconds"] = median([x["processes"]["view"]["seconds"] for x in rounds])
    s["process_ratio"] = median([x["process_ratio"] for x in rounds])
    if "load_view_threads" in rounds[0]:
        s["load_view_threads_tokens_per_s"] = med("load_view_threads", "tokens_per_s")
        s["load_view_threads_cpu_s_per_gtok"] = med("load_view_threads", "cpu_s_per_gtok")
        s["view_threads_ratio"] = (s["load_view_threads_tokens_per_s"]
                                   / s["load_source_tokens_per_s"])
    return s


#: how the source's documents lie in its shards: as they came (a view on a signal nobody ordered
#: by keeps documents at random: the worst case) and ordered by the column the view selects on
#: (``pipeline run --cluster-by``)
LAYOUTS = {"random": "", "clustered": "quality.score"}


def split_groups(view: Path) -> int:
    """Row groups the view keeps part of (not all, not none of their documents)."""
    from storage import read_manifest
    from storage.format.view import Masks

    m = read_manifest(str(view))
    assert m.view is not None
    masks = Masks((view / m.view.masks_path).read_bytes())
    kept, rows = masks.kept_rows(), masks.source_rows.astype(np.int64)
    return int(((kept > 0) & (kept < rows)).sum())


def measure(root: Path, layout: str, args: argparse.Namespace) -> dict[str, Any]:
    """One layout: its source built, its view selected, ``args.runs`` rounds."""
    shutil.rmtree(root / NAMES["source"], ignore_errors=True)
    source = build_source(root, args.tokens, compression=args.shard_compression,
                          cluster_by=LAYOUTS[layout])
    view = run_select(root)
    view["split_row_groups"] = split_groups(root / NAMES["view"])
    print(f"{layout}: source {source['documents']:,} documents, {source['tokens']:,} tokens, "
          f"{source['row_groups']:,} row groups ({args.shard_compression}); view {WHERE}: "
          f"{view['kept']:,} documents ({view['kept'] / view['of']:.1%}), "
          f"{view['kept_tokens']:,} tokens, {view['split_row_groups']:,} row groups split")
    rounds = []
    for r in range(args.runs):
        rounds.append(run_round(root, r, args.epochs, args.view_read_threads))
        x = rounds[-1]
        print(f"  round {r + 1}: source {x['load_source']['tokens_per_s'] / 1e6:.1f} M tok/s "
              f"({x['load_source']['cpu_s_per_gtok']:.2f} CPU-s/Gtok), view "
              f"{x['load_view']['tokens_per_s'] / 1e6:.1f} M tok/s "
              f"({x['load_view']['cpu_s_per_gtok']:.2f}): pairs "
              + ", ".join(f"{q:.2f}x" for q in x["ratios"]))
    s = summarise(rounds)
    print(f"  medians over {args.runs} rounds of {args.epochs} epoch pairs:")
    print(f"    loader   view {s['load_view_tokens_per_s'] / 1e6:.1f} M tok/s vs source "
          f"{s['load_source_tokens_per_s'] / 1e6:.1f} M tok/s: {s['ratio']:.3f}x (median of "
          f"the pairs' ratios {s['ratio_of_pairs_median']:.3f}x; >= 0.9x: "
          f"{'yes' if s['claim_met'] else 'no'})")
    print(f"    CPU      view {s['load_view_cpu_s_per_gtok']:.2f} vs source "
          f"{s['load_source_cpu_s_per_gtok']:.2f} CPU-s per billion tokens delivered "
          f"({s['cpu_per_token_view_vs_source']:.2f}x)")
    print(f"    process  one epoch as a job, from process start to exit: view "
          f"{s['process_view_seconds']:.2f} s vs source {s['process_source_seconds']:.2f} s "
          f"(rate {s['process_ratio']:.3f}x the source's)")
    if args.view_read_threads:
        print(f"    threads  the view with {args.view_read_threads} read threads "
              f"{s['load_view_threads_tokens_per_s'] / 1e6:.1f} M tok/s: "
              f"{s['view_threads_ratio']:.3f}x the source's "
              f"({s['load_view_threads_cpu_s_per_gtok']:.2f} CPU-s per billion tokens)")
    print(f"    reads    a row group fetched, verified, decoded: view "
          f"{s['read_view_us_per_group']:,.0f} us for {s['read_view_tokens_per_group']:,.0f} "
          f"tokens, source {s['read_source_us_per_group']:,.0f} us for "
          f"{s['read_source_tokens_per_group']:,.0f} ({s['read_view_cpu_s_per_gtok']:.2f} vs "
          f"{s['read_source_cpu_s_per_gtok']:.2f} CPU-s per billion tokens)")
    return {"cluster_by": LAYOUTS[layout], "source": source, "view": view, "rounds": rounds,
            "summary": s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3,
                        help="loader epoch pairs (source, view) per round")
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help=f"comma-separated, of: {', '.join(LAYOUTS)}")
    parser.add_argument("--view-read-threads", type=int, default=0,
                        help="also load the view with this many read threads, each pair")
    parser.add_argument("--shard-compression", default="zstd",
                        help="the source's shard codec: zstd (the default), lz4 or none")
    parser.add_argument("--quick", action="store_true", help="5 M tokens, 2 runs")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.runs = 5_000_000, 2
    layouts = [x for x in args.layouts.split(",") if x]
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown:
        parser.error(f"--layouts: {', '.join(unknown)}: not one of {', '.join(LAYOUTS)}")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="view-loader-bench-"))
    results_of = {name: measure(root / name, name, args) for name in layouts}
    pages = None
    if "random" in results_of:
        pages = run_pages(root / "random", args.shard_compression)
        for page, v in pages.items():
            print(f"  pages    {page:>20}: a row group's tokens {v['bytes_vs_writer']:.2f}x the "
                  f"bytes, decoded in {v['decode_vs_writer']:.2f}x the time "
                  f"({v['decode_us_per_group']:,.0f} us)")
    claim = results_of.get("clustered", results_of[layouts[0]])["summary"]
    print(f"\nclaim (a view keeping half the documents within 10 % of its source's tokens/s, "
          f"the source clustered by the column the view selects on): "
          f"{'met' if 'clustered' in results_of and claim['claim_met'] else 'NOT met'} "
          f"({claim['ratio']:.3f}x)")
    name = "view_loader" + ("" if args.shard_compression == "zstd"
                            else f"_{args.shard_compression}") + ("_quick" if args.quick else "")
    results = {"shard_compression": args.shard_compression, "pages": pages, "where": WHERE,
               "runs": args.runs, "epochs": args.epochs,
               "view_read_threads": args.view_read_threads, "layouts": results_of,
               "claim_met": "clustered" in results_of and claim["claim_met"],
               "machine": machine()}
    path = write_results(name, results)
    plot(results_of, RESULTS / f"{name}.png")
    print(f"wrote {path}")
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def plot(results_of: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for layout, res in results_of.items():
        pairs = [p for x in res["rounds"] for p in x["pairs"]]
        for k, marker in (("source", "o-"), ("view", "s--")):
            a.plot([p[k]["tokens_per_s"] / 1e6 for p in pairs], marker,
                   label=f"{layout}: {'source' if k == 'source' else '50 % view'}")
    a.set_xlabel("epoch pair (rounds in turn)")
    a.set_ylabel("loader M tokens/s")
    a.set_title("one epoch of each, in turn")
    a.legend(fontsize=8)
    names = list(results_of)
    ratios = [results_of[n]["summary"]["ratio"] for n in names]
    cpu = [results_of[n]["summary"]["cpu_per_token_view_vs_source"] for n in names]
    xs = range(len(names))
    b.bar([x - 0.2 for x in xs], ratios, 0.4, label="view's tokens/s / source's")
    b.bar([x + 0.2 for x in xs], cpu, 0.4, label="view's CPU per token / source's")
    b.axhline(0.9, color="k", ls=":", lw=1, label="claim: rate >= 0.9x")
    b.set_xticks(list(xs), [f"{n}\n({results_of[n]['view']['split_row_groups']} row groups "
                            "split)" for n in names])
    b.set_title("50 % view against its source, by how the source's documents lie", fontsize=10)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
