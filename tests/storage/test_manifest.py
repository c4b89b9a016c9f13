import json
from pathlib import Path

import pytest

from storage import (
    DatasetNotFoundError,
    Manifest,
    ManifestError,
    RowGroupInfo,
    ShardInfo,
    TokenizerInfo,
    UnsafePathError,
    read_manifest,
    resolve,
    write_manifest,
)


def _manifest(path: str = "shards/part-00000.parquet") -> Manifest:
    shard = ShardInfo(path=path, rows=3, tokens=30, bytes=100, sha256="ab" * 32,
                      row_groups=(RowGroupInfo(2, 20), RowGroupInfo(1, 10)))
    tok = TokenizerInfo("gpt2", "tokenizer.json", "cd" * 32, 50257, 50256, "<|endoftext|>")
    return Manifest(tokenizer=tok, shards=(shard,), schema={"input_ids": "list<int32>"})


def test_round_trip_is_canonical(tmp_path: Path) -> None:
    m = _manifest()
    write_manifest(resolve(str(tmp_path)), m)
    text = (tmp_path / "manifest.json").read_text()
    assert read_manifest(str(tmp_path)) == m
    assert m.to_json() == text
    assert not list(tmp_path.glob(".tmp-*"))  # the temporary file was renamed over


def test_missing_manifest_means_no_dataset(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    with pytest.raises(DatasetNotFoundError, match="manifest.json is missing"):
        read_manifest(str(tmp_path))


@pytest.mark.parametrize("path", ["../outside.parquet", "s3://elsewhere/x.parquet", "/abs.parquet"])
def test_manifest_with_escaping_shard_path_is_rejected(tmp_path: Path, path: str) -> None:
    d = json.loads(_manifest().to_json())
    d["shards"][0]["path"] = path
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(UnsafePathError):
        read_manifest(str(tmp_path))


def test_inconsistent_counts_are_rejected(tmp_path: Path) -> None:
    d = json.loads(_manifest().to_json())
    d["shards"][0]["tokens"] = 31
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="do not add up"):
        read_manifest(str(tmp_path))
