"""Local replicas are memory-mapped: pieces are verified in place and decoded from the mapping,
and a damaged local copy is still a checksum failure that fails over, never a crash."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from loaders import build_dataloader
from loaders import reader as reader_module
from loaders.reader import MappedShards
from storage import ChecksumMismatchError, IndexFormatError
from storage.format.chunk_footer import NO_CODEC
from tests.loaders._crafted import piece_moved_to_the_next_group, without_codecs
from tests.storage.admin.test_verify import craft

SEQ = 255


def _epoch(url: str, **kw) -> list[np.ndarray]:
    return [b["input_ids"].numpy().copy() for b in build_dataloader(url, 4, SEQ, **kw)]


def _shards(root: str) -> list[Path]:
    return sorted(p for p in Path(root, "shards").glob("*.parquet"))


def _replica(tiny_dataset: str, tmp_path: Path, name: str) -> str:
    out = tmp_path / name
    shutil.copytree(tiny_dataset, out)
    return str(out)


def test_local_reads_decode_from_the_mapping(tiny_dataset, no_python_file_reads) -> None:
    """No Python file object in the local decode path (each costs a GIL round trip)."""
    want = _epoch(tiny_dataset)
    got = _epoch(tiny_dataset)
    assert len(got) == len(want) > 10
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_corrupt_local_replica_fails_over(tiny_dataset, tmp_path) -> None:
    bad, good = (_replica(tiny_dataset, tmp_path, n) for n in ("bad", "good"))
    want = _epoch(good)
    for shard in _shards(bad):
        data = bytearray(shard.read_bytes())
        data[len(data) // 3:len(data) // 3 + 64] = b"\0" * 64  # inside a token column chunk
        shard.write_bytes(bytes(data))
    loader = build_dataloader(bad, 4, SEQ, replicas=[good])
    got = [b["input_ids"].numpy().copy() for b in loader]
    assert loader.metrics()["failovers"] > 0
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_truncated_local_shard_is_an_error_naming_it(tiny_dataset, tmp_path) -> None:
    """A short file is refused before it is mapped: a read past the end of a mapping would be
    a bus error that kills the trainer, not an exception."""
    root = _replica(tiny_dataset, tmp_path, "short")
    for shard in _shards(root):
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(Exception, match=r"shards/part-.*\.parquet") as err:
        _epoch(root)
    assert "truncated" in str(err.value) or "bytes" in str(err.value)


def test_truncated_shard_on_one_replica_fails_over(tiny_dataset, tmp_path) -> None:
    bad, good = (_replica(tiny_dataset, tmp_path, n) for n in ("bad", "good"))
    for shard in _shards(bad):
        shard.write_bytes(shard.read_bytes()[:100])
    got = _epoch(bad, replicas=[good])
    want = _epoch(good)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_mapped_shards_keep_a_bounded_number_and_old_buffers_stay_valid(tmp_path) -> None:
    files = []
    for i in range(5):
        path = tmp_path / f"f{i}"
        path.write_bytes(bytes([i]) * (1000 + i))
        files.append(path)
    maps = MappedShards(limit=2)
    first = maps.get(str(files[0]), 1000)
    for i, path in enumerate(files):
        assert bytes(memoryview(maps.get(str(path), 1000 + i))[:3]) == bytes([i]) * 3
    assert len(maps._maps) == 2
    last = maps.get(str(files[4]), 1004)
    MappedShards.release(last, 10, 1004)  # out of the resident set, not out of the file
    assert bytes(memoryview(last)) == bytes([4]) * 1004
    files[0].unlink()  # dropped from the table and deleted: a buffer taken earlier still reads
    assert bytes(memoryview(first)) == b"\0" * 1000
    with pytest.raises(ChecksumMismatchError, match="f1: 1001 bytes on disk, the index says 7"):
        MappedShards().get(str(files[1]), 7)
    with pytest.raises(FileNotFoundError):
        maps.get(str(files[0]), 1000)


def test_a_footer_placing_tokens_outside_the_verified_piece_is_refused(tiny_dataset,
                                                                      tmp_path) -> None:
    """The index's piece for row group 0 names row group 1's bytes (digest included, so it
    verifies), the footer places row group 0 where it is: the mapped shard would decode bytes
    no digest covered (it did, silently, before the reader compared the two). An index
    without shard codecs: the reader decodes under the shard's footer."""
    ds = piece_moved_to_the_next_group(tiny_dataset, tmp_path, codecs=False)
    with pytest.raises(IndexFormatError, match=r"the footer places row group 0's tokens at "
                       r"bytes \[[\d,]+, [\d,]+\), the index verifies"):
        _epoch(str(ds))


def test_a_footer_made_from_the_index_decodes_only_the_verified_piece(
        tiny_dataset, tmp_path, index_footers) -> None:
    """The same crafted index with shard codecs: the footer is made from the index, so row
    group 0 decodes from exactly the verified piece (row group 1's bytes), whose token count
    is not the index's for row group 0: refused, naming both."""
    ds = piece_moved_to_the_next_group(tiny_dataset, tmp_path)
    with pytest.raises(IndexFormatError, match=r"row group 0 holds [\d,]+ tokens where the "
                       r"index says [\d,]+"):
        _epoch(str(ds))


def test_footers_made_from_the_index_read_the_epoch_the_shards_own_do(
        tiny_dataset, tmp_path, no_python_file_reads, index_footers) -> None:
    """An index recording the shards' codecs: no footer is read, and the epoch is the one an
    older index (every footer read and kept) gives, as are two mixes of the two (even shards
    as written before, or odd ones: between them they read every footer once)."""
    older = without_codecs(tiny_dataset, tmp_path)
    n = len(_shards(tiny_dataset))
    mixes = []
    for parity in (0, 1):
        mixed = Path(_replica(tiny_dataset, tmp_path, f"mixed{parity}"))
        craft(mixed, {"shard_codec": {s: NO_CODEC for s in range(parity, n, 2)}})
        mixes.append(str(mixed))

    def run(url: str) -> tuple[list[np.ndarray], float]:
        # one read thread: two that start on a shard together may each fetch its footer
        loader = build_dataloader(url, 4, SEQ, read_threads=1)
        got = [b["input_ids"].numpy().copy() for b in loader]
        return got, loader.metrics()["footers_read"]

    want, every = run(str(older))
    assert len(want) > 10 and every > 1
    footers = {}
    for url in (tiny_dataset, *mixes):
        got, footers[url] = run(url)
        assert len(got) == len(want)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert footers[tiny_dataset] == 0
    assert footers[mixes[0]] + footers[mixes[1]] == every
    assert 0 < footers[mixes[0]] < every


def test_a_small_local_dataset_keeps_its_footers(tiny_dataset, monkeypatch) -> None:
    """Below LOCAL_FOOTER_GROUPS row groups a local dataset is decoded under its shards' own
    footers (cheaper per row group, and few to keep); above it under footers from the index,
    the same epoch."""
    def run() -> tuple[list[np.ndarray], float]:
        loader = build_dataloader(tiny_dataset, 4, SEQ, read_threads=1)
        return [b["input_ids"].numpy().copy() for b in loader], loader.metrics()["footers_read"]

    own, footers = run()
    assert footers > 0
    monkeypatch.setattr(reader_module, "LOCAL_FOOTER_GROUPS", 10)  # the tiny dataset: above
    made, none = run()
    assert none == 0 and len(made) == len(own) > 10
    assert all(np.array_equal(a, b) for a, b in zip(made, own, strict=True))
