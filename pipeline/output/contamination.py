"""A version's decontamination report: what the run's ``decontaminate`` steps found, per eval
set (the documents hit and the matched n-grams of the first :data:`REPORT_EXAMPLES` of them,
by partition and document order: the same report on every rerun), and the manifest's
``stats.contamination`` (the report's name, its sha256 and the documents hit per
``<step>.<set>``).

It is put twice before the commit: content-addressed, ``contamination/<sha16>.json``, which
the manifest names among its ``reports`` (so ``verify``, ``repair`` and ``gc`` treat it like
every object of the version, and each kept version keeps the report it was made with), and as
``contamination.json`` at the dataset's root, the current version's report for people and
tools to open by name. The root copy is whichever run wrote it last (a run that never
committed, too); the manifest's name and sha256 tell the version's own apart.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from pipeline.steps.contract import REPORT_EXAMPLES
from pipeline.steps.decontaminate import cached_index, eval_files
from pipeline.steps.recipe import Recipe
from storage import Manifest, ReplicaSet, display_url
from storage.format.layout import contamination_name
from storage.format.manifest import ObjectInfo

#: the report's name at the dataset's root
REPORT = "contamination.json"
FORMAT = "shardflow.contamination/1"


def build_report(recipe: Recipe, reports: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The report of every ``decontaminate`` entry of ``recipe`` (``None``: none), every
    eval set listed, hit or not; ``reports``: the steps' merged reports by step name."""
    steps: dict[str, Any] = {}
    for spec in recipe.steps:
        if spec.use != "decontaminate":
            continue
        options = spec.kwargs()
        n = options.get("n", 13)
        index = cached_index(options["eval"], n, options.get("text_field", "text")).index
        found = reports.get(spec.name, {})
        sets = {}
        for name, path in eval_files(options["eval"]):
            hit = found.get(name, {})
            sets[name] = {"file": display_url(path), "eval_examples": index.examples_of(name),
                          "documents": int(hit.get("documents", 0)),
                          "examples": list(hit.get("examples", []))[:REPORT_EXAMPLES]}
        steps[spec.name] = {"mode": spec.mode, "n": n,
                            "min_overlap": options.get("min_overlap", 0.0),
                            "eval_sha256": options.get("eval_sha256"), "sets": sets}
    return {"format": FORMAT, "steps": steps} if steps else None


def with_report(store: ReplicaSet, manifest: Manifest, report: dict[str, Any] | None
                ) -> Manifest:
    """``manifest`` with ``stats.contamination`` and the report among its ``reports``, the
    report put first (``None``: unchanged, nothing written)."""
    if report is None:
        return manifest
    data = (json.dumps(report, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()
    sha = hashlib.sha256(data).hexdigest()
    name = contamination_name(sha)
    store.put(name, data)
    store.put(REPORT, data)
    documents = {f"{step}.{eval_set}": s["documents"]
                 for step, entry in report["steps"].items()
                 for eval_set, s in entry["sets"].items()}
    stats = {**manifest.stats, "contamination": {
        "report": name, "sha256": sha, "documents": documents}}
    return replace(manifest, stats=stats,
                   reports=(*manifest.reports, ObjectInfo(name, len(data), sha)))
