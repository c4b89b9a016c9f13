"""The pipeline end to end on a small real corpus, on a real Dask LocalCluster."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq
from tokenizers import Tokenizer

from pipeline.config import PipelineConfig
from pipeline.job import run
from storage import read_manifest
from tests.conftest import PLAYS


def _rows(dataset: str) -> list[tuple[str, list[int]]]:
    m = read_manifest(dataset)
    rows = []
    for shard in m.shards:
        table = pq.read_table(Path(dataset) / shard.path)
        rows += list(zip(table.column("doc_id").to_pylist(),
                         table.column("input_ids").to_pylist(), strict=True))
    return rows


def test_manifest_counts_match_the_shards(tiny_dataset: str) -> None:
    m = read_manifest(tiny_dataset)
    assert m.vocab_size == 50257 and m.eos_id == 50256
    assert len(m.shards) == len(PLAYS) + 1
    counted = 0
    for shard in m.shards:
        path = Path(tiny_dataset) / shard.path
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shard.sha256
        assert path.stat().st_size == shard.bytes
        pf = pq.ParquetFile(path)
        assert pf.num_row_groups == len(shard.row_groups) >= 1
        for i, group in enumerate(shard.row_groups):
            ids = pf.read_row_group(i, columns=["input_ids"]).column(0).to_pylist()
            assert len(ids) == group.rows
            assert sum(map(len, ids)) == group.tokens
            counted += group.tokens
    assert counted == m.total_tokens == m.stats["tokens"] > 100_000
    assert m.stats["documents_out"] == m.total_rows
    assert m.stats["dropped"] == {"empty": 1}
    assert m.stats["documents_in"] == m.total_rows + 1


def test_tokens_decode_back_to_the_cleaned_text(tiny_dataset: str, corpus_dir: Path) -> None:
    tok = Tokenizer.from_file(str(Path(tiny_dataset) / "tokenizer.json"))
    rows = _rows(tiny_dataset)
    assert all(ids[-1] == 50256 and 50256 not in ids[:-1] for _, ids in rows)
    decoded = {doc: tok.decode(ids[:-1]) for doc, ids in rows}
    messy = [decoded[d] for d, _ in rows if d.startswith("zz_messy.txt")]
    assert messy == ["Caf\u00e9 au lait, served hot.\nsecond line with a bell", "The end."]
    for play in PLAYS:
        text = "\n".join(decoded[d] for d, _ in rows if d.startswith(f"{play}:"))
        original = (corpus_dir / play).read_text(encoding="utf-8")
        assert text.split() == original.split()  # same words in the same order


def test_rerun_with_other_worker_count_is_byte_identical(
        tiny_dataset: str, corpus_dir: Path, tmp_path: Path) -> None:
    cfg = PipelineConfig(inputs=[str(corpus_dir / "*.txt")], output=str(tmp_path / "again"),
                         workers=1, dashboard_address="127.0.0.1:0", row_group_tokens=8192)
    summary = run(cfg, progress=False)
    assert summary.tokens == read_manifest(tiny_dataset).total_tokens
    first = (Path(tiny_dataset) / "manifest.json").read_bytes()
    assert (tmp_path / "again" / "manifest.json").read_bytes() == first
    for shard in read_manifest(tiny_dataset).shards:
        assert (tmp_path / "again" / shard.path).read_bytes() == \
            (Path(tiny_dataset) / shard.path).read_bytes()


def test_jsonl_input_quarantines_bad_records(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"body": "first good"}\n{oops\n{"body": null}\n{"body": "second good"}\n')
    out = tmp_path / "ds"
    summary = run(PipelineConfig(inputs=[str(src)], output=str(out), text_field="body",
                                 workers=1, dashboard_address="127.0.0.1:0"), progress=False)
    assert summary.docs_out == 2
    assert summary.quarantined == {"malformed_json": 1, "missing_field": 1}
    m = read_manifest(str(out))
    (quarantine,) = m.quarantine
    data = (out / quarantine.path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == quarantine.sha256
    lines = data.decode().splitlines()
    assert ['"in.jsonl:2"' in lines[0], '"in.jsonl:3"' in lines[1]] == [True, True]
