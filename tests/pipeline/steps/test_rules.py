"""Filter and annotate modes agree, for every rule set, on the web test corpus: the documents
a rule set's filter mode drops are exactly those whose annotate-mode signals fail the same
thresholds (and for the same reason), through the step chain and through a whole run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pipeline.readers import ReadOptions, warc
from pipeline.records import Document
from pipeline.steps.chain import StepChain
from pipeline.steps.recipe import Recipe, spec
from pipeline.web.steps import RULE_SETS

REPO = Path(__file__).resolve().parents[3]
WARCS = REPO / "tests" / "pipeline" / "readers" / "data"
#: a threshold moved so that the corpus decides both ways on it too
OPTIONS = {"gopher_quality": {"min_doc_words": 120}, "c4": {"min_num_sentences": 8},
           "fineweb": {"short_line_thr": 0.5}, "gopher_repetition": {"dup_line_frac": 0.1}}


@pytest.fixture(scope="module")
def documents() -> list[Document]:
    docs = []
    for path in sorted(WARCS.glob("*/*.warc*")):
        with open(path, "rb") as fh:
            docs += [d for d in warc.read(fh, path.name, ReadOptions(), [0])
                     if isinstance(d, Document)]
    return docs


def _through(recipe: Recipe, docs: list[Document]) -> tuple[list[str | None], list[dict]]:
    chain = StepChain(recipe)
    texts, signals = [], []
    for d in docs:
        texts.append(chain(d))
        signals.append(dict(chain.last[1]) if texts[-1] is not None else {})
    chain.close()
    return texts, signals


@pytest.mark.parametrize("options", [False, True])
@pytest.mark.parametrize("rule_set", sorted(RULE_SETS))
def test_filter_drops_exactly_what_annotate_signals_fail(documents: list[Document],
                                                         rule_set: str, options: bool) -> None:
    opts: dict[str, Any] = OPTIONS[rule_set] if options else {}
    base = (spec("extract"), spec("clean"))
    filtered, _ = _through(Recipe((*base, spec(rule_set, **opts))), documents)
    annotated, signals = _through(Recipe((*base, spec(rule_set, mode="annotate", **opts))),
                                  documents)
    judge = RULE_SETS[rule_set](**{k: v for k, v in opts.items()}).judge
    prefix = f"{rule_set}."
    drops = 0
    for before, kept, measured in zip(annotated, filtered, signals, strict=True):
        if before is None:  # extraction or cleaning dropped it in both
            assert kept is None
            continue
        reason = judge({k[len(prefix):]: v for k, v in measured.items() if k.startswith(prefix)})
        assert (kept is None) == (reason is not None), (rule_set, reason, before[:200])
        drops += reason is not None
    assert 0 < drops < sum(t is not None for t in annotated), "the corpus must decide both ways"


def _run(out: Path, *flags: str) -> list[dict]:
    inputs = [str(p) for p in sorted(WARCS.glob("*/*.warc*"))]
    done = subprocess.run([sys.executable, "-m", "pipeline", "run", "--no-progress",
                           "--dedup", "none", "--output", str(out), *flags, *inputs],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [r for p in sorted((out / "shards").iterdir()) for r in pq.read_table(p).to_pylist()]


def test_a_run_that_annotates_gopher_keeps_what_the_filter_keeps_plus_the_rest(
        tmp_path: Path) -> None:
    """Gopher's two rule sets change no text, so a whole run's decisions compare: the
    filtered run's documents are exactly the annotated run's that pass judge()."""
    filtered = _run(tmp_path / "filter", "--filters", "gopher")
    annotated = _run(tmp_path / "annotate", "--annotate", "gopher")
    rules = {name: RULE_SETS[name]() for name in ("gopher_repetition", "gopher_quality")}

    def passes(row: dict) -> bool:
        for name, rule in rules.items():
            prefix = f"{name}."
            if rule.judge({k[len(prefix):]: v for k, v in row.items()
                           if k.startswith(prefix)}) is not None:
                return False
        return True

    assert [r["doc_id"] for r in filtered] == [r["doc_id"] for r in annotated if passes(r)]
    assert len(filtered) < len(annotated)
    manifest = json.loads((tmp_path / "annotate" / "manifest.json").read_text())
    assert "gopher_quality.n_words" in manifest["stats"]["signals"]
    assert not any(k.startswith("gopher") for k in manifest["stats"]["dropped"])
