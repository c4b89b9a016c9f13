"""Every input format, and every kind of bad input, read partition by partition (no Dask)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.planning.discovery import discover
from pipeline.planning.plan import Partition, plan_partitions
from pipeline.readers import ReadOptions, read_partition
from pipeline.records import Document, InputError, Rejected


def _read(path: Path, target: int = 1 << 30, **opts: object) -> list[Document | Rejected]:
    parts = plan_partitions(discover([str(path)]), target)
    return [x for p in parts for x in read_partition(p, ReadOptions(**opts))]  # type: ignore


def _docs(items: list) -> list[str]:
    return [d.text for d in items if isinstance(d, Document)]


def _bad(items: list) -> list[tuple[str, str]]:
    return [(r.source, r.reason) for r in items if isinstance(r, Rejected)]


GOOD = [{"text": f"document number {i}", "id": f"d{i}"} for i in range(5)]


def _jsonl(records: list) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_jsonl_plain_gzip_zstd_give_the_same_documents(tmp_path: Path) -> None:
    data = _jsonl(GOOD)
    (tmp_path / "a.jsonl").write_bytes(data)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    for name in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst"):
        items = _read(tmp_path / name, id_field="id")
        assert _docs(items) == [r["text"] for r in GOOD]
        assert [d.doc_id for d in items] == [r["id"] for r in GOOD]


def test_csv_and_parquet(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text('id,body\n1,"multi\nline"\n2,plain\n3\n')
    items = _read(tmp_path / "a.csv", text_field="body", id_field="id")
    assert _docs(items) == ["multi\nline", "plain"]
    assert _bad(items) == [("a.csv:5", "malformed_csv")]
    table = pa.table({"text": ["x", None, "y", "z"], "n": [1, 2, 3, 4]})
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=1)
    items = _read(tmp_path / "p.parquet", target=1)  # one row group per partition
    assert _docs(items) == ["x", "y", "z"]
    assert _bad(items) == [("p.parquet#1", "missing_field")]
    assert len(plan_partitions(discover([str(tmp_path / "p.parquet")]), 1)) == 4
    assert _bad(_read(tmp_path / "p.parquet", text_field="n")) == [
        ("p.parquet#rg0", "wrong_type")]


def test_bad_jsonl_records_are_rejected_with_line_and_reason(tmp_path: Path) -> None:
    lines = [b'{"text": "good one"}', b"{broken", b'{"other": 1}', b'{"text": 5}', b"[1]",
             b'{"text": "bad \xff\xfe utf8"}', b'{"text": "' + b"x" * 5000 + b'"}',
             b'{"text": "good two"}']
    (tmp_path / "x.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    items = _read(tmp_path / "x.jsonl", max_record_bytes=1000)
    assert _docs(items) == ["good one", "good two"]
    assert _bad(items) == [("x.jsonl:2", "malformed_json"), ("x.jsonl:3", "missing_field"),
                           ("x.jsonl:4", "wrong_type"), ("x.jsonl:5", "not_an_object"),
                           ("x.jsonl:6", "invalid_utf8"), ("x.jsonl:7", "record_too_large")]
    utf8 = next(r for r in items if isinstance(r, Rejected) and r.reason == "invalid_utf8")
    assert "\\xff\\xfe" in utf8.raw  # shown escaped, never silently replaced
    assert utf8.file.endswith("x.jsonl")


def test_split_file_names_records_by_byte_offset(tmp_path: Path) -> None:
    data = _jsonl(GOOD * 40) + b"{broken\n"
    (tmp_path / "big.jsonl").write_bytes(data)
    items = _read(tmp_path / "big.jsonl", target=len(data) // 3)
    assert _docs(items) == [r["text"] for r in GOOD * 40]
    assert _bad(items) == [(f"big.jsonl@{len(data) - 8}", "malformed_json")]


def test_truncated_gzip_keeps_what_came_before(tmp_path: Path) -> None:
    data = gzip.compress(_jsonl(GOOD * 400))
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    items = _read(tmp_path / "t.jsonl.gz")
    assert len(_docs(items)) > 100
    *cut, (source, reason) = _bad(items)
    assert reason == "truncated_input" and source.startswith("t.jsonl.gz@")
    assert [r for _, r in cut] in ([], ["malformed_json"])  # the line the break cut in two


def test_unreadable_files_are_one_reject_each(tmp_path: Path) -> None:
    (tmp_path / "not.jsonl.gz").write_bytes(b"this is not gzip at all\n")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 garbage")
    assert [r for _, r in _bad(_read(tmp_path / "not.jsonl.gz"))] == ["unreadable_file"]
    assert [r for _, r in _bad(_read(tmp_path / "bad.parquet"))] == ["unreadable_file"]
    gone = Partition(0, str(tmp_path / "gone.jsonl"), "jsonl", None, 0, -1)
    assert [r.reason for r in read_partition(gone, ReadOptions())] == ["unreadable_file"]


def test_huge_single_record_is_skipped_without_holding_it(tmp_path: Path) -> None:
    huge = b'{"text": "' + b"y" * (3 << 20) + b'"}\n'
    (tmp_path / "h.jsonl").write_bytes(_jsonl(GOOD[:1]) + huge + _jsonl(GOOD[1:2]))
    items = _read(tmp_path / "h.jsonl", max_record_bytes=1 << 20)
    assert _docs(items) == [GOOD[0]["text"], GOOD[1]["text"]]
    (rej,) = [r for r in items if isinstance(r, Rejected)]
    assert rej.reason == "record_too_large" and len(rej.raw) <= 1024
    assert str(len(huge)) in rej.detail


def test_text_paragraphs(tmp_path: Path) -> None:
    (tmp_path / "h.txt").write_bytes(b"Ber.\nWho's there?\n\n \nFran.\nNay, answer me.\n"
                                     b"\nbad \xff\n")
    items = _read(tmp_path / "h.txt")
    assert [(d.doc_id, d.text) for d in items if isinstance(d, Document)] == [
        ("h.txt:1", "Ber.\nWho's there?"), ("h.txt:5", "Fran.\nNay, answer me.")]
    assert _bad(items) == [("h.txt:8", "invalid_utf8")]


def test_discover_is_sorted_and_errors_name_the_input(tmp_path: Path) -> None:
    for name in ("b.txt", "a.txt", "c.jsonl.gz"):
        (tmp_path / name).write_bytes(b"")
    files = discover([str(tmp_path / "*.txt"), str(tmp_path / "c.jsonl.gz")])
    assert [(Path(f.url).name, f.fmt, f.compression) for f in files] == [
        ("a.txt", "txt", None), ("b.txt", "txt", None), ("c.jsonl.gz", "jsonl", "gzip")]
    with pytest.raises(InputError, match="no input files match"):
        discover([str(tmp_path / "*.md")])
    (tmp_path / "data.xml").write_text("<a/>")
    with pytest.raises(InputError, match=r"data\.xml: unsupported input format"):
        discover([str(tmp_path / "data.xml")])
