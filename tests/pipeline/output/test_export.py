"""``pipeline export``: what pandas and HF ``datasets`` read back equals what the loader serves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from storage import ReplicaSet, read_manifest, shards_of, tokens

REPO = Path(__file__).resolve().parents[3]
SEQ = 63


def _export(dataset: str, out: Path, fmt: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "pipeline", "export", dataset, str(out),
                           "--format", fmt, "--no-progress"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _shard_documents(dataset: str) -> list[np.ndarray]:
    """Each document's ids in manifest order, straight from the shards (pyarrow)."""
    import pyarrow.parquet as pq

    m = read_manifest(dataset)
    docs: list[np.ndarray] = []
    for shard in shards_of(dataset, m):
        column = pq.read_table(Path(dataset) / shard.path).column("input_ids")
        docs += tokens.documents(column, m.schema["input_ids"])
    return docs


def _windows_from_documents(dataset: str, docs: list[list[int]]) -> list[tuple[int, ...]]:
    """The loader's samples as the plan defines them: windows of SEQ+1 tokens on a grid inside
    each row group of the document stream (every document ends with EOS in the shards)."""
    m = read_manifest(dataset)
    stream = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs])
    out, start = [], 0
    for shard in shards_of(dataset, m):
        for group in shard.row_groups:
            for k in range(group.tokens // (SEQ + 1)):
                lo = start + k * (SEQ + 1)
                out.append(tuple(stream[lo:lo + SEQ + 1].tolist()))
            start += group.tokens
    return sorted(out)


def _loader_windows(dataset: str) -> list[tuple[int, ...]]:
    from loaders import build_dataloader

    windows = []
    for batch in build_dataloader(dataset, batch_size=1, seq_len=SEQ, shuffle=False):
        ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
        windows.append(tuple(ids + labels[-1:]))
    return sorted(windows)


@pytest.fixture(scope="module")
def loader_windows(tiny_dataset: str) -> list[tuple[int, ...]]:
    return _loader_windows(tiny_dataset)


def test_parquet_list_read_by_pandas_matches_the_shards_and_the_loader(
        tiny_dataset: str, tmp_path: Path, loader_windows: list[tuple[int, ...]]) -> None:
    summary = _export(tiny_dataset, tmp_path / "out", "parquet-list")
    m = read_manifest(tiny_dataset)
    assert f"{m.total_rows:,} documents" in summary
    frame = pd.concat([pd.read_parquet(p) for p in sorted((tmp_path / "out").glob("*.parquet"))])
    assert list(frame.columns) == ["doc_id", "input_ids"] and len(frame) == m.total_rows
    docs = [list(ids) for ids in frame["input_ids"]]
    assert docs == [d.tolist() for d in _shard_documents(tiny_dataset)]
    assert _windows_from_documents(tiny_dataset, docs) == loader_windows


def test_hf_folder_loads_with_load_dataset(tiny_dataset: str, tmp_path: Path,
                                           loader_windows: list[tuple[int, ...]],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local folder: nothing to fetch
    import datasets
    _export(tiny_dataset, tmp_path / "hf", "hf")
    ds = datasets.load_dataset(str(tmp_path / "hf"), split="train",
                               cache_dir=str(tmp_path / "cache"))
    assert ds.column_names == ["doc_id", "input_ids"]
    docs = ds["input_ids"]
    assert _windows_from_documents(tiny_dataset, docs) == loader_windows


def test_jsonl_lines_are_documents_in_order(tiny_dataset: str, tmp_path: Path) -> None:
    _export(tiny_dataset, tmp_path / "js", "jsonl")
    rows = [json.loads(line) for p in sorted((tmp_path / "js").glob("*.jsonl"))
            for line in p.read_text().splitlines()]
    assert [r["input_ids"] for r in rows] == [d.tolist() for d in _shard_documents(tiny_dataset)]
    assert all(isinstance(r["doc_id"], str) for r in rows)


def test_export_is_reproducible(tiny_dataset: str, tmp_path: Path) -> None:
    from pipeline.output.export import export

    store = ReplicaSet.from_urls([tiny_dataset])
    export(store, str(tmp_path / "a"), "parquet-list", progress=False)
    export(store, str(tmp_path / "b"), "parquet-list", progress=False)
    a = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    b = {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()}
    assert a == b and a


def test_unknown_format_and_missing_dataset_are_clear(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pipeline", "export", str(tmp_path / "none"),
                           str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: no dataset at")
