"""The ``input_ids`` encoding: round trips, dtype choice, legacy lists, clear errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import tokens


@given(st.lists(st.lists(st.integers(0, 70_000), max_size=40), max_size=30),
       st.integers(0, 5))
def test_pack_unpack_round_trip_also_for_slices(docs: list[list[int]], cut: int) -> None:
    dtype = tokens.token_dtype(70_001)
    assert dtype == np.dtype("<u4")
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    values = np.array([t for d in docs for t in d], dtype=np.int64)
    column = tokens.pack(lengths, values, dtype)
    name = tokens.encoding_name(dtype)
    assert name == "binary<uint32le>"
    assert np.array_equal(tokens.unpack(column, name), values)
    assert np.array_equal(tokens.lengths(column, name), lengths)
    sliced = column.slice(min(cut, len(docs)))
    rest = docs[min(cut, len(docs)):]
    assert [d.tolist() for d in tokens.documents(sliced, name)] == rest


def test_gpt2_ids_take_two_bytes_and_larger_vocabularies_four() -> None:
    assert tokens.token_dtype(50257).itemsize == 2
    assert tokens.token_dtype(65536).itemsize == 2
    assert tokens.token_dtype(128_256).itemsize == 4
    assert tokens.dtype_of("binary<uint16le>") == np.dtype("<u2")


def test_ids_that_do_not_fit_are_refused_not_wrapped() -> None:
    with pytest.raises(tokens.TokenEncodingError, match="70000 does not fit in uint16"):
        tokens.pack(np.array([1]), np.array([70_000]), np.dtype("<u2"))


def test_datasets_written_as_list_int32_still_read() -> None:
    column = pa.array([[1, 2, 3], [], [4]], type=pa.list_(pa.int32()))
    assert tokens.unpack(column, tokens.LEGACY_LIST).tolist() == [1, 2, 3, 4]
    assert tokens.lengths(column, tokens.LEGACY_LIST).tolist() == [3, 0, 1]


def test_unknown_encodings_are_named_in_the_error() -> None:
    with pytest.raises(tokens.TokenEncodingError, match="'binary<int8>'"):
        tokens.dtype_of("binary<int8>")


def test_a_footer_is_compared_with_the_index_chunk_by_chunk() -> None:
    """What the writer records (each row group's token chunk, from its own footer) agrees;
    a count or one chunk moved is named."""
    from pipeline.output.shards import encode_shard

    ids = [np.arange(i, i + 300) % 50_000 for i in range(40)]
    data, info = encode_shard([str(i) for i in range(40)], ids, target_rg_tokens=2_000)
    meta = tokens.parse_footer(data[len(data) - info.footer_length:])
    chunks = [(g.offset, g.length) for g in info.row_groups]
    assert len(chunks) > 2 and tokens.footer_disagreement(meta, chunks) is None
    assert tokens.footer_disagreement(meta, chunks[:-1]) == (
        f"the footer holds {len(chunks)} row groups, the index gives the shard "
        f"{len(chunks) - 1}")
    moved = [chunks[0], chunks[2], *chunks[2:]]
    assert tokens.footer_disagreement(meta, moved).startswith(
        "row group 1's token chunk: the footer places it at ")
