"""A version's drop records are its objects: ``storage verify`` checks them, and ``gc`` keeps
those the kept versions name and removes the others (``lineage/`` is collectable)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import ReplicaSet, read_manifest
from storage.admin.gc import collect
from storage.io.index_store import drop_records_of


def test_gc_keeps_the_kept_version_s_drop_records_only(tmp_path: Path) -> None:
    rows = [{"text": t} for t in ("A document long enough to keep here.", "tiny",
                                  "A document long enough to keep here.", "short one",
                                  "Another document that is kept as well.")]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ds"

    def build(min_chars: int) -> set[str]:
        run(PipelineConfig(inputs=[str(tmp_path / "r.jsonl")], output=str(out), workers=1,
                           dashboard_address="127.0.0.1:0", min_chars=min_chars, card=False),
            progress=False)
        m = read_manifest(str(out))
        assert m.drops is not None and m.drops.path.startswith("lineage/drops-")
        return {d.path for d in drop_records_of(str(out), m)} | {m.drops.path}

    first = build(5)  # drops "tiny" (and the duplicate)
    second = build(10)  # drops "tiny" and "short one": another steps record
    assert len(first) == len(second) == 3 and len(first & second) == 1  # the dups record
    on_disk = {str(p.relative_to(out)) for p in (out / "lineage").iterdir()}
    assert on_disk == first | second
    collect(ReplicaSet.from_urls([str(out)]), keep=1, min_age_s=0)
    assert {str(p.relative_to(out)) for p in (out / "lineage").iterdir()} == second
