import hashlib
import io

import blake3
import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import PipelineConfig
from pipeline.output.shards import check_codec, encode_shard, row_group_bounds, shard_codec
from storage import tokens


@given(st.lists(st.integers(min_value=1, max_value=500), max_size=200),
       st.integers(min_value=1, max_value=2000))
def test_row_groups_cover_documents_in_order(counts: list[int], target: int) -> None:
    bounds = row_group_bounds(counts, target)
    assert [i for lo, hi in bounds for i in range(lo, hi)] == list(range(len(counts)))
    for lo, hi in bounds[:-1]:
        assert sum(counts[lo:hi]) >= target
        assert sum(counts[lo:hi - 1]) < target  # closes as soon as it reaches the target


def test_encode_shard_is_deterministic_and_readable() -> None:
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 50257, size=n, dtype=np.int32) for n in rng.integers(1, 300, 50)]
    doc_ids = [f"f.txt:{i}" for i in range(50)]
    data1, info = encode_shard(doc_ids, ids, 1000)
    groups = info.row_groups
    data2, _ = encode_shard(doc_ids, ids, 1000)
    assert data1 == data2
    pf = pq.ParquetFile(io.BytesIO(data1))
    assert pf.num_row_groups == len(groups) > 1
    assert pf.metadata.row_group(0).column(1).compression == "ZSTD"
    table = pf.read()
    assert table.column("doc_id").to_pylist() == doc_ids
    got = tokens.documents(table.column("input_ids"), "binary<uint16le>")
    assert all(np.array_equal(a, b) for a, b in zip(ids, got, strict=True))
    for g in groups:  # each row group's token column chunk is located and checksummed
        assert blake3.blake3(data1[g.offset:g.offset + g.length]).hexdigest() == g.blake3
    footer = data1[-info.footer_length:]
    assert footer.endswith(b"PAR1") and hashlib.sha256(footer).hexdigest() == info.footer_sha256
    assert [g.tokens for g in groups] == [
        sum(len(ids[i]) for i in range(lo, lo + g.rows))
        for lo, g in zip(np.cumsum([0] + [g.rows for g in groups])[:-1], groups, strict=True)]


@pytest.mark.parametrize(("codec", "name"), [("zstd", "ZSTD"), ("lz4", "LZ4"),
                                             ("none", "UNCOMPRESSED")])
def test_shard_codec_is_written_and_read_back(codec: str, name: str) -> None:
    """``--shard-compression``: every column chunk in the codec, the same rows, and the codec
    read back from the metadata (phase 2 re-encodes a shard in its phase-1 codec)."""
    rng = np.random.default_rng(1)
    ids = [rng.integers(0, 50257, size=n, dtype=np.int32) for n in rng.integers(1, 300, 40)]
    doc_ids = [f"f.txt:{i}" for i in range(40)]
    data, info = encode_shard(doc_ids, ids, 1000, compression=codec)
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    assert {meta.row_group(i).column(j).compression for i in range(meta.num_row_groups)
            for j in range(meta.num_columns)} == {name}
    assert shard_codec(meta) == codec
    got = tokens.documents(pq.read_table(io.BytesIO(data)).column("input_ids"),
                           "binary<uint16le>")
    assert all(np.array_equal(a, b) for a, b in zip(ids, got, strict=True))
    zstd, _ = encode_shard(doc_ids, ids, 1000)
    assert (data == zstd) == (codec == "zstd")
    for g in info.row_groups:
        assert blake3.blake3(data[g.offset:g.offset + g.length]).hexdigest() == g.blake3


def test_an_unknown_codec_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="zstd, lz4, none, not 'gzip'"):
        check_codec("gzip")
    with pytest.raises(ValueError, match="shard compression"):
        PipelineConfig(shard_compression="snappy")
