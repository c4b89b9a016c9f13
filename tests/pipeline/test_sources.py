import json
from pathlib import Path

import pytest

from pipeline.sources import (
    Document,
    InputError,
    Rejected,
    discover,
    iter_jsonl,
    iter_paragraphs,
    read_partition,
)


def test_paragraphs_named_by_first_line() -> None:
    lines = iter(["Ber.\n", "Who's there?\n", "\n", "\n", "Fran.\n", "Nay, answer me.\n"])
    docs = list(iter_paragraphs(lines, "h.txt"))
    assert docs == [Document("h.txt:1", "Ber.\nWho's there?"),
                    Document("h.txt:5", "Fran.\nNay, answer me.")]


def test_jsonl_bad_records_are_rejected_with_line_and_reason() -> None:
    lines = iter(['{"text": "good"}\n', "{broken\n", '{"other": 1}\n', '{"text": 5}\n', "[1]\n"])
    out = list(iter_jsonl(lines, "x.jsonl", "text"))
    assert out[0] == Document("x.jsonl:1", "good")
    reasons = [(r.source, r.reason) for r in out[1:] if isinstance(r, Rejected)]
    assert reasons == [("x.jsonl:2", "malformed_json"), ("x.jsonl:3", "missing_field"),
                       ("x.jsonl:4", "wrong_type"), ("x.jsonl:5", "not_an_object")]


def test_discover_is_sorted_and_deterministic(tmp_path: Path) -> None:
    for name in ("b.txt", "a.txt", "c.jsonl"):
        (tmp_path / name).write_text("x\n")
    parts = discover([str(tmp_path / "*.txt"), str(tmp_path / "c.jsonl")])
    assert [Path(p.url).name for p in parts] == ["a.txt", "b.txt", "c.jsonl"]
    assert [p.index for p in parts] == [0, 1, 2]
    assert [p.fmt for p in parts] == ["txt", "txt", "jsonl"]


def test_discover_errors_name_the_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no input files match"):
        discover([str(tmp_path / "*.txt")])
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(InputError, match=r"data\.csv: unsupported input format"):
        discover([str(tmp_path / "data.csv")])


def test_read_partition_jsonl_text_field(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"body": f"doc {i}"}) for i in range(3)) + "\n")
    (part,) = discover([str(path)])
    docs = list(read_partition(part, text_field="body"))
    assert [d.text for d in docs] == ["doc 0", "doc 1", "doc 2"]
