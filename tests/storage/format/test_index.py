"""The binary row-group index: round trip, column-only reads, checksums, size."""

from __future__ import annotations

import numpy as np
import pytest

from storage.format.index import (
    IndexFormatError,
    build_index,
    digest_hex,
    index_ref,
    read_columns,
    read_index,
    shard_paths,
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
