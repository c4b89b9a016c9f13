"""A run with ``--id-field``: the ids are the records' own, so each kept document's source
(``file:line``) is kept in a ``source`` column, and ``trace`` answers by either."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import read_manifest, shards_of

LINES = [{"id": "a", "text": "The first document, long enough to keep."},
         {"id": "b", "text": "tiny"},
         {"id": "c", "text": "The first document, long enough to keep."},
         {"id": "d", "text": "Another document that stays in the dataset."}]


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("ids")
    body = "".join(json.dumps(x) + "\n" for x in LINES) + "{not json\n"
    (src / "r.jsonl").write_text(body)
    out = src / "ds"
    run(PipelineConfig(inputs=[str(src / "r.jsonl")], output=str(out), workers=1,
                       dashboard_address="127.0.0.1:0", id_field="id", min_chars=10,
                       card=False), progress=False)
    return out


def _trace(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["trace", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_source_column_holds_file_line(ds: Path) -> None:
    m = read_manifest(str(ds))
    assert m.lineage["source"] == "column" and m.schema["source"] == "string"
    rows = [r for s in shards_of(str(ds), m)
            for r in pq.read_table(ds / s.path, columns=["doc_id", "source"]).to_pylist()]
    assert rows == [{"doc_id": "a", "source": "r.jsonl:1"},
                    {"doc_id": "d", "source": "r.jsonl:4"}]


def test_trace_by_id_and_by_source(ds: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kept = _trace(capsys, str(ds), "d")["document"]
    assert (kept["source"], kept["source_in"]) == ("r.jsonl:4", "column")
    assert _trace(capsys, str(ds), "--dropped", "r.jsonl:4")["status"] == "kept"
    short = _trace(capsys, str(ds), "--dropped", "r.jsonl:2")
    assert (short["status"], short["step"]["name"], short["reason"]) == (
        "dropped", "clean", "too_short")
    dup = _trace(capsys, str(ds), "--dropped", "r.jsonl:3")
    assert dup["status"] == "duplicate" and dup["of"]["doc_id"] == "a"
    assert dup["of"]["source"] == "r.jsonl:1"
    bad = _trace(capsys, str(ds), "--dropped", "r.jsonl:5")
    assert (bad["status"], bad["reason"]) == ("quarantined", "malformed_json")


def test_a_near_duplicate_names_its_cluster_s_kept_document(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old "
            "oak tree and the farmer walks slowly along the muddy road towards the market "
            "where his neighbours sell apples pears cheese bread and fresh milk every sunday "
            "morning before the church bells ring across the quiet green valley")
    words = text.split(" ")
    changed = [*words[:-1], "hills"]
    other = "A different text about ships, harbours and the sea, long enough to keep."
    rows = [{"id": "orig", "text": " ".join(words)}, {"id": "other", "text": other},
            {"id": "near", "text": " ".join(changed)}]
    (tmp_path / "n.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ds"
    run(PipelineConfig(inputs=[str(tmp_path / "n.jsonl")], output=str(out), workers=1,
                       dashboard_address="127.0.0.1:0", id_field="id", near_dup=True,
                       card=False), progress=False)
    got = _trace(capsys, str(out), "--dropped", "n.jsonl:3")
    assert got["status"] == "near_duplicate"
    assert (got["of"]["doc_id"], got["of"]["source"]) == ("orig", "n.jsonl:1")
    assert "near" in _trace(capsys, str(out), "orig")["steps"][-2]["mode"]


def test_parquet_rows_and_csv_lines_are_sources_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa

    same = "A document that both files hold, long enough."
    pq.write_table(pa.table({"id": ["p0", "p1", "p2"], "text": [same, "x", "Its own text."]}),
                   tmp_path / "t.parquet")
    (tmp_path / "c.csv").write_text(f"id,text\nc1,{same.replace(',', '')}\nc2,\"{same}\"\n")
    out = tmp_path / "ds"
    run(PipelineConfig(inputs=[str(tmp_path / "t.parquet"), str(tmp_path / "c.csv")],
                       output=str(out), workers=1, dashboard_address="127.0.0.1:0",
                       id_field="id", min_chars=5, card=False), progress=False)
    short = _trace(capsys, str(out), "--dropped", "t.parquet#1")  # rows count from 0
    assert (short["status"], short["reason"]) == ("dropped", "too_short")
    # c.csv sorts first: its line 3 is kept, the Parquet row 0 duplicates it
    dup = _trace(capsys, str(out), "--dropped", "t.parquet#0")
    assert dup["status"] == "duplicate"
    assert (dup["of"]["doc_id"], dup["of"]["source"]) == ("c2", "c.csv:3")
    kept = _trace(capsys, str(out), "p2")["document"]
    assert (kept["source"], kept["source_in"]) == ("t.parquet#2", "column")
