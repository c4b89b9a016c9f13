"""``pipeline trace`` on a web crawl (the WARC/WET test crawl of tests/pipeline/web): a kept
page (its ``file@offset`` source column, URL and signals), a page the extract step dropped,
the copy of a page dropped as a duplicate of the original, and quarantined records, each
checked against the WARC bytes at the offset the answer names."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import read_manifest, shards_of
from tests.pipeline.web import warcs
from tests.pipeline.web.test_web_job import crawl  # noqa: F401 - the fixture


def _record_at(source: str) -> bytes:
    """The WARC record a ``file@offset`` source names: the one gzip member there."""
    path, _, offset = source.rpartition("@")
    with open(path, "rb") as f:
        f.seek(int(offset))
        return zlib.decompressobj(31).decompress(f.read())


@pytest.fixture(scope="module")
def web(crawl: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("webds") / "web"
    run(PipelineConfig(inputs=[str(crawl / "*.gz")], output=str(out), workers=1,
                       dashboard_address="127.0.0.1:0", pii="mask",
                       filters="gopher_repetition", annotate="c4", card=False),
        progress=False)
    return out


def _trace(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["trace", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _kept_rows(ds: Path) -> list[dict]:
    return [r for s in shards_of(str(ds), read_manifest(str(ds)))
            for r in pq.read_table(ds / s.path).drop_columns(["input_ids"]).to_pylist()]


def test_a_kept_page_names_its_warc_record_steps_and_signals(
        web: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = read_manifest(str(web))
    assert m.lineage["source"] == "column"
    row = next(r for r in _kept_rows(web) if ".warc.gz@" in r["source"])
    got = _trace(capsys, str(web), row["doc_id"])
    doc = got["document"]
    assert doc["source"] == row["source"] and doc["source_in"] == "column"
    assert doc["metadata"]["url"] == row["url"]
    assert f"WARC-Target-URI: {row['url']}".encode() in _record_at(row["source"])
    signals = {k: v for k, v in row.items() if "." in k}  # gopher's measures (annotate)
    assert signals and doc["signals"] == signals
    names = [s["name"] for s in got["steps"]]
    assert names[0] == "extract" and "gopher_repetition" in names and names[-1] == "tokenize"
    by_name = {s["name"]: s for s in m.lineage["steps"]}
    assert all(s["config_sha256"] == by_name[s["name"]]["config_sha256"]
               for s in got["steps"] if s["kind"] == "step")


def test_an_empty_page_was_dropped_by_the_extract_step(
        web: Path, crawl: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    m = read_manifest(str(web))
    sources = [f"{crawl / 'a.warc.gz'}@{o}" for o in _member_offsets(crawl / "a.warc.gz")]
    empty = next(s for s in sources
                 if b"WARC-Target-URI: https://empty.example/" in _record_at(s))
    got = _trace(capsys, str(web), "--dropped", empty)
    assert got["status"] == "dropped" and got["reason"] == "extract_empty"
    assert got["step"]["name"] == "extract"
    assert got["step"]["version"] == next(s["version"] for s in m.lineage["steps"]
                                          if s["name"] == "extract")


def test_the_copied_page_is_a_duplicate_of_the_original(
        web: Path, crawl: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    original = warcs.debian_pages(24, min_bytes=3000)[0][0]
    copy = f"{crawl / 'b.warc.gz'}@0"  # b.warc.gz starts with the copy
    assert f"WARC-Target-URI: {original}?copy".encode() in _record_at(copy)
    got = _trace(capsys, str(web), "--dropped", copy)
    assert got["status"] == "duplicate"
    assert got["of"]["metadata"]["url"] == original
    assert f"WARC-Target-URI: {original}\r".encode() in _record_at(got["of"]["source"])


def test_quarantined_records_say_why(web: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = read_manifest(str(web))
    entries = [json.loads(line) for q in m.quarantine
               for line in (web / q.path).read_text().splitlines()]
    assert {e["reason"] for e in entries} == {"malformed_record", "truncated_input"}
    for e in entries:
        got = _trace(capsys, str(web), "--dropped", e["source"])
        assert (got["status"], got["reason"], got["detail"]) == (
            "quarantined", e["reason"], e["detail"])


def _member_offsets(path: Path) -> list[int]:
    """Where each gzip member of a WARC starts (each record is one member)."""
    data = path.read_bytes()
    out, at = [], 0
    while at < len(data):
        out.append(at)
        d = zlib.decompressobj(31)
        d.decompress(data[at:])
        at = len(data) - len(d.unused_data)
        if not d.eof:
            break
    return out
