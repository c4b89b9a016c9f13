"""Trying another threshold: ``select`` + an epoch against rerunning the pipeline + an epoch.

The issue's comparison, on the same input: the demo corpus (the Shakespeare plays, ~66 k
documents) is built once with ``--annotate gopher`` (every Gopher quality measure a signal
column, nothing dropped). Then, ``--runs`` interleaved rounds of the two ways to train on the
documents of at least ``--min-words`` words:

- ``select``: ``python -m pipeline select SRC --where '"gopher_quality.n_words" >= N'``
  (a fresh process, as a user runs it), then one loader epoch over the view;
- ``rerun``: ``python -m pipeline run --filters gopher_quality`` with ``min_doc_words = N``
  and every other Gopher quality threshold open (so it keeps exactly what the select keeps;
  the script checks the documents and tokens agree), then one loader epoch over it.

Both on the same 2 cores, fresh processes for the commands, medians of the rounds.
Results: ``benchmarks/results/select_vs_rerun.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, ROOT, median, write_results

#: every other gopher_quality rule open: the rerun drops on the word count alone
OPEN = {"max_doc_words": 10**9, "min_avg_word_length": 0, "max_avg_word_length": 10**9,
        "max_symbol_word_ratio": 10.0, "max_bullet_lines_ratio": 10.0,
        "max_ellipsis_lines_ratio": 10.0, "min_alpha_words_ratio": 0.0, "min_stop_words": 0}


def _run(args: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{args}: {proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def _epoch(url: str) -> tuple[float, int]:
    from loaders import build_dataloader

    t0 = time.perf_counter()
    n = sum(int(b["input_ids"].numel()) for b in build_dataloader(url, 8, 256, rank=0,
                                                                   world_size=1))
    return time.perf_counter() - t0, n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--min-words", type=int, default=20)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="select-vs-rerun-"))
    common = ["--no-progress", "--dashboard-address", "127.0.0.1:0"]
    src = root / "plays"
    if not (src / "manifest.json").exists():
        build = _run(["run", "--annotate", "gopher", "--output", str(src), *common])
        print(f"source built with --annotate gopher in {build:.1f} s")
    where = f'"gopher_quality.n_words" >= {args.min_words}'
    options = json.dumps({"gopher_quality.min_doc_words": args.min_words,
                          **{f"gopher_quality.{k}": v for k, v in OPEN.items()}})
    from storage import read_manifest

    rounds: list[dict[str, Any]] = []
    for r in range(args.runs):
        out: dict[str, Any] = {}
        for way in (("select", "rerun") if r % 2 == 0 else ("rerun", "select")):
            dst = root / ("plays-long" if way == "select" else "rerun")
            shutil.rmtree(dst, ignore_errors=True)
            if way == "select":
                seconds = _run(["select", str(src), "--where", where, "--output", str(dst),
                                "--no-progress"])
            else:
                seconds = _run(["run", "--filters", "gopher_quality", "--filter-options",
                                options, "--output", str(dst), *common])
            epoch_s, tokens = _epoch(str(dst))
            m = read_manifest(str(dst))
            out[way] = {"seconds": seconds, "epoch_s": epoch_s, "total_s": seconds + epoch_s,
                        "documents": m.total_rows, "tokens": m.total_tokens,
                        "epoch_tokens": tokens}
        if (out["select"]["documents"], out["select"]["tokens"]) != (
                out["rerun"]["documents"], out["rerun"]["tokens"]):
            raise SystemExit(f"the two ways kept different documents: {out}")
        out["speedup"] = out["rerun"]["total_s"] / out["select"]["total_s"]
        rounds.append(out)
        print(f"round {r + 1}: select {out['select']['seconds']:.1f} s + epoch "
              f"{out['select']['epoch_s']:.1f} s; rerun {out['rerun']['seconds']:.1f} s + epoch "
              f"{out['rerun']['epoch_s']:.1f} s ({out['select']['documents']:,} documents, "
              f"{out['select']['tokens']:,} tokens each): {out['speedup']:.1f}x")
    summary = {k: median([x[w][f] for x in rounds]) for k, w, f in (
        ("select_s", "select", "seconds"), ("select_epoch_s", "select", "epoch_s"),
        ("rerun_s", "rerun", "seconds"), ("rerun_epoch_s", "rerun", "epoch_s"),
        ("select_total_s", "select", "total_s"), ("rerun_total_s", "rerun", "total_s"))}
    summary["speedup"] = summary["rerun_total_s"] / summary["select_total_s"]
    summary["speedup_within_rounds_median"] = median([x["speedup"] for x in rounds])
    print(f"\nmedians over {args.runs} rounds: select + epoch {summary['select_total_s']:.1f} s, "
          f"rerun + epoch {summary['rerun_total_s']:.1f} s: {summary['speedup']:.1f}x")
    results = {"where": where, "filter_options": options, "rounds": rounds,
               "summary": summary, "documents": rounds[-1]["select"]["documents"]}
    path = write_results("select_vs_rerun", results)
    plot(summary, RESULTS / "select_vs_rerun.png")
    print(f"wrote {path}")
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ways = ["select + epoch", "rerun + epoch"]
    ax.barh(ways, [summary["select_s"], summary["rerun_s"]], label="make the dataset")
    ax.barh(ways, [summary["select_epoch_s"], summary["rerun_epoch_s"]],
            left=[summary["select_s"], summary["rerun_s"]], label="one loader epoch")
    ax.set_xlabel("seconds (median)")
    ax.set_title(f"another threshold: select {summary['speedup']:.0f}x faster than a rerun")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
