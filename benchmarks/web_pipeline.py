"""WARC -> main text -> Gopher/C4/FineWeb rules -> PII -> GPT-2 tokens: Shardflow vs datatrove.

The same job on the same WARC files and the same cores, each system in a fresh process,
interleaved rounds, medians:

- Shardflow: ``python -m pipeline run '*.warc.gz' --filters gopher,c4,fineweb --pii mask
  --dedup none`` (FastWARC, Resiliparse, our rule sets), through ``pipeline.driver.job.run``,
  cluster
  start and commit included.
- datatrove: ``WarcReader`` -> ``Trafilatura`` (its and FineWeb's extractor, default
  precision and 1 s timeout) -> ``GopherRepetitionFilter`` -> ``GopherQualityFilter`` ->
  ``C4QualityFilter`` -> ``FineWebQualityFilter`` -> ``PIIFormatter`` -> ``DocumentTokenizer``
  (the same GPT-2 tokenizer.json), ``LocalPipelineExecutor`` with a task per file.

Language ID is left out of both: datatrove's ``LanguageFilter`` needs fastText's lid.176,
a download. The extractors differ (that is the choice docs/web-data.md explains), so the
two keep different documents; the rules' own agreement is tested in
tests/pipeline/web/test_agreement.py.

Inputs: WARC files written here with warcio from the HTML manuals under /usr/share/doc.

    python benchmarks/web_pipeline.py                 # default: 4 files x 60 pages, 2 rounds
    python benchmarks/web_pipeline.py --files 8 --pages 120 --rounds 3
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_utils import RESULTS, median, run_child, write_results  # noqa: E402


def make_warcs(folder: Path, files: int, pages: int) -> dict[str, int]:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    html = sorted(p for p in Path("/usr/share/doc").rglob("*.html")
                  if p.is_file() and p.stat().st_size >= 2000)
    if not html:
        raise SystemExit("no HTML under /usr/share/doc")
    n = 0
    size = 0
    for f in range(files):
        with open(folder / f"crawl-{f:03d}.warc.gz", "wb") as out:
            writer = WARCWriter(out, gzip=True)
            for i in range(pages):
                path = html[(f * pages + i) % len(html)]
                headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html")],
                                           protocol="HTTP/1.1")
                writer.write_record(writer.create_warc_record(
                    f"https://docs.example.org/{f}/{i}/{path.name}", "response",
                    payload=io.BytesIO(path.read_bytes()), http_headers=headers))
                n += 1
        size += (folder / f"crawl-{f:03d}.warc.gz").stat().st_size
    return {"records": n, "bytes": size}


def child_shardflow(folder: str, workers: int) -> dict:
    from pipeline.config import PipelineConfig
    from pipeline.driver.job import run

    out = tempfile.mkdtemp(prefix="bench-web-sf-")
    cfg = PipelineConfig(inputs=[f"{folder}/*.warc.gz"], output=out, workers=workers,
                         filters="gopher,c4,fineweb", pii="mask", dedup="none",
                         dashboard_address="127.0.0.1:0")
    t = time.perf_counter()
    summary = run(cfg, log=io.StringIO(), progress=False)
    seconds = time.perf_counter() - t
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": seconds, "docs_in": summary.docs_in, "docs_out": summary.docs_out,
            "tokens": summary.tokens, "dropped": summary.dropped}


def child_datatrove(folder: str, workers: int) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import WarcReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    from pipeline.tasks import tokenizing

    work = Path(tempfile.mkdtemp(prefix="bench-web-dt-"))
    tok = tokenizing.load("gpt2", None)
    (work / "tokenizer.json").write_text(tok.json)
    files = len(list(Path(folder).glob("*.warc.gz")))
    t = time.perf_counter()
    LocalPipelineExecutor(
        [WarcReader(folder, glob_pattern="*.warc.gz"), Trafilatura(favour_precision=True),
         GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(),
         FineWebQualityFilter(), PIIFormatter(),
         DocumentTokenizer(str(work / "tokens"), tokenizer_name_or_path=str(
             work / "tokenizer.json"), eos_token=tok.eos_token, shuffle_documents=False)],
        tasks=files, workers=workers, logging_dir=str(work / "logs")).run()
    seconds = time.perf_counter() - t
    tokens = sum(p.stat().st_size for p in (work / "tokens").glob("*.ds")) // 2
    stats = {}
    for p in (work / "logs" / "stats").glob("*.json"):
        for step in json.loads(p.read_text()):
            for k, v in step.get("stats", {}).items():
                if isinstance(v, dict) and "total" in v:
                    v = v["total"]
                if isinstance(v, (int, float)):
                    key = f"{step['name']}/{k}"
                    stats[key] = stats.get(key, 0) + v
    docs_out = next((int(v) for k, v in stats.items() if "PII/total" in k), 0)
    timeouts = next((int(v) for k, v in stats.items() if "Trafilatura/timeout" in k), 0)
    shutil.rmtree(work, ignore_errors=True)
    return {"seconds": seconds, "tokens": tokens, "docs_out": docs_out,
            "extract_timeouts": timeouts, "stats": stats}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["shardflow", "datatrove"]
    secs = [results["median_seconds"][n] for n in names]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    bars = ax.bar(names, secs, color=["#3a7", "#888"])
    for bar, n in zip(bars, names, strict=True):
        docs = results["records"] / results["median_seconds"][n]
        ax.annotate(f"{results['median_seconds'][n]:.1f} s\n{docs:.1f} records/s",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                    va="bottom", fontsize=8)
    ax.set_ylabel("wall seconds (median)")
    ax.set_title(f"WARC -> text -> rules -> PII -> tokens, {results['records']} records, "
                 f"{results['workers']} workers: {results['speedup']:.2f}x", fontsize=9)
    ax.set_ylim(0, max(secs) * 1.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=4, help="WARC files (one task each)")
    ap.add_argument("--pages", type=int, default=60, help="records per file")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per system")
    ap.add_argument("--workers", type=int, default=2, help="processes each system uses")
    ap.add_argument("--child", choices=["shardflow", "datatrove"], help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = child_shardflow if args.child == "shardflow" else child_datatrove
        print(json.dumps(fn(args.folder, args.workers)))
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-web-warc-"))
    try:
        made = make_warcs(folder, args.files, args.pages)
        print(f"{made['records']} records in {args.files} WARC files, {made['bytes']:,} bytes")
        runs: dict[str, list[dict]] = {"shardflow": [], "datatrove": []}
        with open("/proc/loadavg") as fh:
            load_before = fh.read().split()[:3]
        for r in range(args.rounds):
            for name in ("shardflow", "datatrove"):
                got = run_child([str(Path(__file__).resolve()), "--child", name, "--folder",
                                 str(folder), "--workers", str(args.workers)], 1)
                runs[name].append(got)
                print(f"round {r + 1} {name:9s} {got['seconds']:7.1f} s  "
                      f"{got['tokens']:,} tokens  {got.get('docs_out')} docs out")
        with open("/proc/loadavg") as fh:
            load_after = fh.read().split()[:3]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    med = {n: median([x["seconds"] for x in v]) for n, v in runs.items()}
    ratios = [d["seconds"] / s["seconds"]
              for s, d in zip(runs["shardflow"], runs["datatrove"], strict=True)]
    results = {"records": made["records"], "warc_bytes": made["bytes"], "files": args.files,
               "workers": args.workers, "rounds": args.rounds, "runs": runs,
               "median_seconds": med, "speedup": med["datatrove"] / med["shardflow"],
               "round_ratios": ratios, "loadavg_before": load_before,
               "loadavg_after": load_after}
    print(f"median: shardflow {med['shardflow']:.1f} s, datatrove {med['datatrove']:.1f} s: "
          f"{results['speedup']:.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios)}); "
          f"load average {' '.join(load_before)} -> {' '.join(load_after)}")
    path = write_results("web_pipeline", results)
    plot(results, RESULTS / "web_pipeline.png")
    print(f"wrote {path} and {RESULTS / 'web_pipeline.png'}")


if __name__ == "__main__":
    main()
