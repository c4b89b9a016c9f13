"""The binary row-group index: round trip, column-only reads, checksums, size."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from storage.format.chunk_footer import CODECS, NO_CODEC
from storage.format.index import (
    IndexFormatError,
    build_index,
    build_index_arrays,
    check_values,
    digest_hex,
    index_ref,
    read_columns,
    read_index,
    shard_paths,
    shards_from_columns,
)
from storage.format.manifest import RowGroupInfo, ShardInfo


def _shards(n_shards: int = 3, groups: int = 4) -> list[ShardInfo]:
    rng = np.random.default_rng(0)
    out = []
    for s in range(n_shards):
        rgs = tuple(RowGroupInfo(int(rng.integers(1, 100)), int(rng.integers(1, 300_000)),
                                 4 + 1000 * g, 900, f"{rng.integers(2**63):064x}")
                    for g in range(groups + s))
        out.append(ShardInfo(f"shards/part-{s:05d}.parquet", sum(g.rows for g in rgs),
                             sum(g.tokens for g in rgs), 10_000, f"{s:064x}", rgs, 321,
                             f"{s + 7:064x}"))
    return out


def test_round_trip_keeps_every_fact() -> None:
    shards = _shards()
    data = build_index(shards)
    assert build_index(shards) == data  # deterministic
    cols = read_index(data, index_ref("index.sfidx", data).header_sha256)
    groups = [g for s in shards for g in s.row_groups]
    assert cols["rows"].tolist() == [g.rows for g in groups]
    assert cols["tokens"].tolist() == [g.tokens for g in groups]
    assert cols["offset"].tolist() == [g.offset for g in groups]
    assert cols["length"].tolist() == [g.length for g in groups]
    assert [digest_hex(cols["digest"], i) for i in range(len(groups))] == [
        g.sha256[:32] for g in groups]  # 128 bits of each sha256
    assert shard_paths(cols) == [s.path for s in shards]
    assert cols["first_group"].tolist() == [0, 4, 9, 15]
    assert digest_hex(cols["footer_sha256"], 2) == shards[2].footer_sha256


def test_a_reader_fetches_only_the_columns_it_asks_for() -> None:
    data = build_index(_shards())
    reads: list[tuple[int, int]] = []

    def read_range(lo: int, hi: int) -> bytes:
        reads.append((lo, hi))
        return data[lo:hi]

    cols = read_columns(read_range, ["tokens"])
    assert list(cols) == ["tokens"] and len(reads) == 2  # the header, then one column
    assert sum(hi - lo for lo, hi in reads[1:]) == 4 * 15


def test_corruption_is_caught() -> None:
    data = bytearray(build_index(_shards()))
    ref = index_ref("i", bytes(data))
    data[-5] ^= 1  # inside the last column
    with pytest.raises(IndexFormatError, match="checksum"):
        read_index(bytes(data))
    with pytest.raises(IndexFormatError, match="magic"):
        read_index(b"PAR1" + bytes(data)[4:])
    header = bytearray(build_index(_shards()))
    header[20] ^= 1
    with pytest.raises(IndexFormatError, match="header checksum|format|Expecting"):
        read_index(bytes(header), ref.header_sha256)


def test_under_48_bytes_per_row_group() -> None:
    shards = _shards(n_shards=10, groups=500)
    n = sum(len(s.row_groups) for s in shards)
    assert len(build_index(shards)) / n < 48


def test_shard_codecs_round_trip_and_an_older_index_reads_without_them() -> None:
    shards = [replace(s, codec=c) for s, c in zip(_shards(), ["ZSTD", "", "LZ4_RAW"],
                                                    strict=True)]
    cols = read_index(build_index(shards))
    assert cols["shard_codec"].tolist() == [CODECS["ZSTD"], NO_CODEC, CODECS["LZ4_RAW"]]
    assert [s.codec for s in shards_from_columns(cols)] == ["ZSTD", "", "LZ4_RAW"]
    # An index written before the column existed: read as before, every codec unknown.
    older = {k: v for k, v in cols.items() if k != "shard_codec"}
    again = read_index(build_index_arrays(older))
    assert "shard_codec" not in again
    assert [s.codec for s in shards_from_columns(again)] == ["", "", ""]
    check_values(again)


def test_an_unknown_codec_in_the_index_is_named() -> None:
    cols = dict(read_index(build_index(_shards())))
    cols["shard_codec"] = np.array([CODECS["ZSTD"], 3, CODECS["ZSTD"]], dtype=np.uint8)  # LZO
    with pytest.raises(IndexFormatError, match=r"shard_codec\[1\] = 3 is not a known"):
        check_values(read_index(build_index_arrays(cols)))
    with pytest.raises(ValueError, match="index columns"):
        build_index_arrays({**cols, "shard_kind": np.zeros(3, dtype=np.uint8)})


def test_index_shards_builds_each_shard_when_asked_and_holds_the_columns_only() -> None:
    """An admin tool's view of a v2 dataset's shards: every ``ShardInfo`` by position, by
    path and in order is the one the index records (SHA-256 digests kept as their first 128
    bits), ``objects`` lists paths, sizes and checksums; holding it costs a few bytes a row
    group beside the columns, where building every ``ShardInfo`` costs hundreds."""
    import tracemalloc

    from storage.format.index import IndexShards

    shards = _shards(n_shards=20, groups=2_000)
    cols = read_index(build_index(shards))  # views of the object's bytes
    view = IndexShards(cols)
    assert len(view) == len(shards)
    for i in (0, 7, len(shards) - 1, -1):
        got, want = view[i], shards[i]
        assert (got.path, got.rows, got.tokens, got.bytes, got.sha256) == (
            want.path, want.rows, want.tokens, want.bytes, want.sha256)
        assert [(g.rows, g.tokens, g.offset, g.length, g.sha256) for g in got.row_groups] == [
            (g.rows, g.tokens, g.offset, g.length, g.sha256[:32]) for g in want.row_groups]
    assert view.get(shards[3].path) == view[3] and view.get("shards/none.parquet") is None
    assert view[2:4] == [view[2], view[3]] and list(view)[5] == view[5]
    assert view.objects() == [(s.path, s.bytes, s.sha256) for s in shards]
    with pytest.raises(IndexError):
        view[len(shards)]
    groups = sum(len(s.row_groups) for s in shards)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = IndexShards(cols)
        held.get(shards[0].path)
        lazy = tracemalloc.get_traced_memory()[0] - before
        before = tracemalloc.get_traced_memory()[0]
        every = shards_from_columns(cols)
        whole = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(every) == len(shards)
    assert lazy / groups < 2, lazy / groups
    assert whole / groups > 300, whole / groups
