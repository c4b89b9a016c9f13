"""``python -m pipeline trace``: a document's lineage, or why a source record is not kept.

Answers come from what the run kept, never from the inputs (they may be gone): the shards (the
document's row, its source, its signals), the manifest (``lineage``: the steps it went
through with their versions and ``config_sha256``, the tokenizer, the code; or, for a dataset
written before lineage, the recipe in ``config``), the quarantine files and the lineage's drop
records (:mod:`pipeline.lineage.records`). Both answers are JSON-able dicts;
:mod:`pipeline.lineage.render` prints them.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.lineage import provenance, records
from pipeline.lineage.locate import Found, find_kept, kept_at
from storage import Manifest, ReplicaSet
from storage.io.index_store import drop_records_of


class TraceError(ValueError):
    """What was asked cannot be answered (no such document, a view, ...): one line."""


def _check(manifest: Manifest) -> None:
    if manifest.view is not None:
        raise TraceError(f"a view (of {manifest.view.source}): trace the dataset it selects "
                         "from")


def steps_of(manifest: Manifest) -> list[dict[str, Any]]:
    """The steps every kept document went through, in order: the recipe's (from
    ``lineage.steps``, else the recipe ``config`` recorded, hashed here), dedup when on,
    then the tokenizer."""
    steps = manifest.lineage.get("steps")
    if steps is None:
        steps = provenance.step_records(list(manifest.config.get("steps") or []))
    out = [dict(s, kind="step") for s in steps]
    dedup = manifest.config.get("dedup")
    if dedup and dedup != "none" or manifest.config.get("near_dup"):
        kinds = [k for k, on in (("exact", dedup == "exact"),
                                 ("near", bool(manifest.config.get("near_dup")))) if on]
        out.append({"name": "dedup", "kind": "dedup", "mode": "+".join(kinds)})
    tok = manifest.tokenizer
    out.append({"name": "tokenize", "kind": "tokenizer", "tokenizer": tok.name,
                "sha256": tok.sha256, "vocab_size": tok.vocab_size})
    return out


def source_of(manifest: Manifest, found: Found) -> tuple[str, str]:
    """A kept document's source and where it was read: ``column`` or ``doc_id`` (the id is
    the source: ``file:line``, ``file@offset``, ``file#row``)."""
    src = found.columns.get("source")
    if src:
        return str(src), provenance.IN_COLUMN
    return found.doc_id, provenance.IN_DOC_ID


def _document(manifest: Manifest, found: Found) -> dict[str, Any]:
    source, where = source_of(manifest, found)
    signals = {k: v for k, v in found.columns.items() if "." in k}
    meta = {k: v for k, v in found.columns.items()
            if k not in ("doc_id", "source") and "." not in k}
    return {"doc_id": found.doc_id, "source": source, "source_in": where,
            "shard": found.shard, "row": found.row, "row_group": found.row_group,
            "tokens": found.tokens, "metadata": meta, "signals": signals}


def trace(store: ReplicaSet, manifest: Manifest, doc_id: str) -> dict[str, Any]:
    """Where kept document ``doc_id`` came from, the steps it went through, its signals."""
    _check(manifest)
    found = find_kept(store, manifest, doc_id)
    if found is None:
        raise TraceError(f"no kept document has doc_id {doc_id!r} (for a record that is not "
                         "in the dataset: trace --dropped SOURCE)")
    return {"status": "kept", "document": _document(manifest, found),
            "steps": steps_of(manifest), "code": manifest.lineage.get("code"),
            "inputs": manifest.lineage.get("inputs")}


def _quarantined(store: ReplicaSet, manifest: Manifest, source: str) -> dict[str, Any] | None:
    for obj in manifest.quarantine:
        for line in store.get(obj.path, sha256=obj.sha256).decode("utf-8").splitlines():
            if not line:
                continue
            entry = json.loads(line)
            if entry.get("source") == source:
                return {"status": "quarantined", "reason": entry.get("reason"),
                        "detail": entry.get("detail"), "file": entry.get("file"),
                        "raw": entry.get("raw", "")[:200], "record": obj.path}
    return None


def _step(manifest: Manifest, name: str) -> dict[str, Any]:
    return next((s for s in steps_of(manifest) if s.get("name") == name), {"name": name})


def _dropped(store: ReplicaSet, manifest: Manifest, source: str) -> dict[str, Any] | None:
    drops = drop_records_of(store, manifest)  # the list read once, for the chain below too
    for obj in drops:
        for line in records.decode(store.get(obj.path, sha256=obj.sha256), obj.path):
            if line.get("s") != source:
                continue
            if records.kind_of(obj.path) == records.STEPS:
                return {"status": "dropped", "step": _step(manifest, line["t"]),
                        "reason": line["r"], "record": obj.path}
            part, pos = line["k"]
            keeper = kept_at(store, manifest, part, pos, drops)
            return {"status": line["r"], "record": obj.path,
                    "of": None if keeper is None else _document(manifest, keeper)}
    return None


def why_dropped(store: ReplicaSet, manifest: Manifest, source: str) -> dict[str, Any]:
    """Why the record at ``source`` (``file:line``, ``file@offset``, ``file#row``) is not in
    the dataset: dropped by a step (which, with its version, and the reason), a duplicate
    (``duplicate`` / ``near_duplicate``, of which kept document), or quarantined (reason,
    detail); a kept one says so, with its doc id."""
    _check(manifest)
    out = _dropped(store, manifest, source) or _quarantined(store, manifest, source)
    if out is not None:
        return {"source": source, **out}
    found = find_kept(store, manifest, source, by="source")
    if found is not None:
        return {"source": source, "status": "kept", "document": _document(manifest, found)}
    if not manifest.lineage:
        raise TraceError(f"{source!r}: not kept and not quarantined; this dataset was written "
                         "before runs kept a record of their drops, so why cannot be told")
    raise TraceError(f"no record of source {source!r}: not kept, dropped or quarantined (a "
                     "source is file:line, file@offset or file#row as the run named it; "
                     "trace DOC_ID shows a kept document's)")
