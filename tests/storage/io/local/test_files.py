"""LocalFiles reads as fsspec's LocalFileSystem does, holds a dataset's reads to the symlink
rules, hands every other call to fsspec's filesystem, and pickles without it."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem
from hypothesis import given
from hypothesis import strategies as st

from storage.io.local.dataset_fs import DatasetFileSystem
from storage.io.local.files import LocalFiles
from storage.io.local.paths import UnsafeSymlinkError
from storage.io.urls import resolve

BOUND = st.one_of(st.none(), st.integers(-40, 40))


def _outcome(read):  # type: ignore[no-untyped-def]
    try:
        return read()
    except Exception as exc:  # the same error is part of the contract
        return type(exc)


@given(data=st.binary(max_size=30), start=BOUND, end=BOUND)
def test_ranges_read_as_fsspec_reads_them(tmp_path_factory: pytest.TempPathFactory,
                                          data: bytes, start: int | None,
                                          end: int | None) -> None:
    path = tmp_path_factory.mktemp("ranges") / "f.bin"
    path.write_bytes(data)
    want = _outcome(lambda: LocalFileSystem().cat_file(str(path), start=start, end=end))
    got = _outcome(lambda: LocalFiles().cat_file(f"file://{path}", start=start, end=end))
    assert got == want


def test_a_dataset_read_through_a_link_out_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "ds", tmp_path / "elsewhere"
    (root / "shards").mkdir(parents=True)
    outside.mkdir()
    (outside / "x.parquet").write_bytes(b"not ours")
    (root / "shards" / "in.parquet").write_bytes(b"ours")
    os.symlink(outside / "x.parquet", root / "shards" / "out.parquet")
    files = resolve(str(root)).confined().fs
    assert isinstance(files, LocalFiles) and files.dataset_root == str(root)
    assert files.cat_file(str(root / "shards" / "in.parquet"), 1, 3) == b"ur"
    with pytest.raises(UnsafeSymlinkError, match="out.parquet"):
        files.cat_file(str(root / "shards" / "out.parquet"))
    with pytest.raises(FileNotFoundError):
        files.cat_file(str(root / "shards" / "missing.parquet"))


def test_other_calls_go_to_fsspec_and_a_copy_makes_its_own(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"12345")
    plain, dataset = resolve(str(tmp_path)), resolve(str(tmp_path)).confined()
    assert plain.is_local and dataset.is_local
    assert type(plain.fs.fsspec) is LocalFileSystem
    assert isinstance(dataset.fs.fsspec, DatasetFileSystem)
    assert dataset.fs.find(dataset.path("a")) == [str(tmp_path / "a" / "f")]
    assert dataset.fs.info(dataset.path("a/f"))["size"] == 5
    copy = pickle.loads(pickle.dumps(dataset.fs))
    assert copy._fs is None and copy.dataset_root == dataset.fs.dataset_root
    assert copy.exists(dataset.path("a/f")) and copy.cat_file(dataset.path("a/f"), -2) == b"45"
