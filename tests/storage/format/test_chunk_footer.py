"""A footer made from the index decodes a token chunk exactly as the shard's own footer does;
chunks it cannot describe are named, never decoded wrongly."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.format import chunk_footer
from storage.format.chunk_footer import CODECS, ChunkFormatError, footerless_codec, page_values
from storage.format.tokens import chunk_range

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False),
                    pa.field("input_ids", pa.binary(), nullable=False)])
#: pyarrow's writer names for the codecs
WRITER_CODEC = {"UNCOMPRESSED": "none", "SNAPPY": "snappy", "GZIP": "gzip",
                "BROTLI": "brotli", "ZSTD": "zstd", "LZ4_RAW": "lz4"}


def _shard(docs: list[bytes], codec: str, rows_per_group: int, page_bytes: int,
           page_version: str = "1.0", schema: pa.Schema = SCHEMA,
           dictionary: list[str] | bool = ("doc_id",),  # type: ignore[assignment]
           statistics: bool = False) -> bytes:
    table = pa.table({"doc_id": [str(i) for i in range(len(docs))],
                      "input_ids": pa.array(docs, pa.binary())}, schema=schema)
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=rows_per_group, compression=WRITER_CODEC[codec],
                   use_dictionary=list(dictionary) if not isinstance(dictionary, bool)
                   else dictionary, data_page_size=page_bytes,
                   data_page_version=page_version, write_statistics=statistics)
    return out.getvalue()


def _decode_both(data: bytes) -> tuple[list[pa.Array], list[pa.Array]]:
    """Every row group's token column under the shard's footer and under one made from the
    chunks alone (as the loader makes it: offsets, lengths, the pages' own counts)."""
    buf = pa.py_buffer(data)
    meta = pq.read_metadata(pa.BufferReader(buf))
    codec = footerless_codec(meta)
    assert codec
    chunks = []
    for g in range(meta.num_row_groups):
        start, end = chunk_range(meta, g)
        values, raw = page_values(memoryview(data)[start:end])
        chunks.append((start, end - start, values, raw))
    made = pq.ParquetFile(pa.BufferReader(buf),
                          metadata=chunk_footer.metadata(chunks, CODECS[codec]))
    own = pq.ParquetFile(pa.BufferReader(buf))
    return ([own.read_row_group(g, columns=["input_ids"]).column(0).combine_chunks()
             for g in range(meta.num_row_groups)],
            [made.read_row_group(g).column(0).combine_chunks()
             for g in range(meta.num_row_groups)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
       codec=st.sampled_from(sorted(CODECS)), rows_per_group=st.integers(1, 40),
       page_bytes=st.sampled_from([64, 4096, 1 << 20]),
       page_version=st.sampled_from(["1.0", "2.0"]), statistics=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_a_footer_from_the_chunks_decodes_what_the_shards_own_does(
        lengths: list[int], codec: str, rows_per_group: int, page_bytes: int, page_version: str,
        statistics: bool, seed: int) -> None:
    """Including page headers with statistics (long min/max values, fields the reader
    skips: a Thrift binary skipped by its length once advanced from the wrong position)."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 50257, n).astype("<u2").tobytes() for n in lengths]
    own, made = _decode_both(_shard(docs, codec, rows_per_group, page_bytes, page_version,
                                    statistics=statistics))
    assert len(own) == len(made) > 0
    for a, b in zip(own, made, strict=True):
        assert a.equals(b)
    assert b"".join(x.as_py() for arr in made for x in arr) == b"".join(docs)


@pytest.mark.parametrize("statistics", [False, True])
def test_the_page_counts_are_the_footers(statistics: bool) -> None:
    """Many small pages per chunk: the values and the uncompressed size the page headers add
    up to are the shard footer's own (with statistics: headers of ~2 KB)."""
    docs = [bytes(range(200)) * 5] * 300
    data = _shard(docs, "ZSTD", 100, 256, statistics=statistics)
    meta = pq.read_metadata(pa.BufferReader(data))
    for g in range(meta.num_row_groups):
        col = meta.row_group(g).column(1)
        start, end = chunk_range(meta, g)
        assert page_values(data[start:end]) == (col.num_values, col.total_uncompressed_size)


def test_a_footer_names_more_than_fourteen_row_groups() -> None:
    """Thrift's list header changes form at 15 elements."""
    docs = [bytes([i]) * 10 for i in range(40)]
    own, made = _decode_both(_shard(docs, "LZ4_RAW", 2, 1 << 20))
    assert len(made) == 20 and all(a.equals(b) for a, b in zip(own, made, strict=True))


@pytest.mark.parametrize("case", ["dictionary", "nullable", "list", "missing"])
def test_columns_a_footer_from_the_index_cannot_describe_record_no_codec(case: str) -> None:
    docs = [b"ab" * 10] * 20
    if case == "dictionary":
        data = _shard(docs, "ZSTD", 10, 1 << 20, dictionary=True)
    elif case == "nullable":
        data = _shard(docs, "ZSTD", 10, 1 << 20, schema=pa.schema(
            [SCHEMA.field(0), pa.field("input_ids", pa.binary(), nullable=True)]))
    else:
        table = (pa.table({"input_ids": pa.array([[1, 2]] * 20, pa.list_(pa.int32()))})
                 if case == "list" else pa.table({"other": pa.array(docs)}))
        out = io.BytesIO()
        pq.write_table(table, out, use_dictionary=False)
        data = out.getvalue()
    assert footerless_codec(pq.read_metadata(pa.BufferReader(data))) == ""


def test_a_shard_of_plain_chunks_records_its_codec() -> None:
    for codec in CODECS:
        data = _shard([b"xy" * 50] * 30, codec, 10, 1 << 20)
        assert footerless_codec(pq.read_metadata(pa.BufferReader(data))) == codec


def _one_chunk(codec: str = "ZSTD", dictionary: bool = False) -> bytes:
    data = _shard([b"tokens" * 40] * 50, codec, 50, 512,
                  dictionary=True if dictionary else ("doc_id",))
    start, end = chunk_range(pq.read_metadata(pa.BufferReader(data)), 0)
    return data[start:end]


def test_a_truncated_or_padded_chunk_is_named() -> None:
    chunk = _one_chunk()
    with pytest.raises(ChunkFormatError, match="past the chunk"):
        page_values(chunk[:-1])
    with pytest.raises(ChunkFormatError):
        page_values(chunk + b"\0\0\0")  # a page header of zeros is no data page
    with pytest.raises(ChunkFormatError, match="empty"):
        page_values(b"")


def test_a_dictionary_page_is_refused() -> None:
    with pytest.raises(ChunkFormatError, match="dictionary page"):
        page_values(_one_chunk(dictionary=True))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_hostile_bytes_are_a_chunk_format_error_or_counts(data: bytes) -> None:
    """Whatever the bytes, page_values ends (no hang, nothing but its own error), and counts
    it returns are never negative."""
    try:
        values, raw = page_values(data)
    except ChunkFormatError:
        return
    assert values >= 0 and raw >= 0


@settings(max_examples=200, deadline=None)
@given(flip=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_a_flipped_bit_is_named_or_still_tiles(flip: int, bit: int) -> None:
    """A damaged chunk (the digest would catch it first; this is the parser's own guard):
    a ChunkFormatError, or counts that still add up -- never another exception."""
    chunk = bytearray(_one_chunk("UNCOMPRESSED"))
    chunk[flip % len(chunk)] ^= 1 << bit
    try:
        values, raw = page_values(bytes(chunk))
    except ChunkFormatError:
        return
    assert values >= 0 and raw >= 0


def test_a_footer_refuses_an_unknown_codec() -> None:
    with pytest.raises(ChunkFormatError, match="unknown codec 3"):
        chunk_footer.footer([(0, 10, 1, 10)], 3)  # LZO: pyarrow cannot read it


def test_the_fast_parse_is_pyarrows_own_parse() -> None:
    """metadata() parses through pyarrow's FileMetaData unpickling; read_metadata of the same
    footer must give the same metadata (the fallback where a pyarrow lacks it)."""
    chunks = [(4, 1000, 7, 1500), (1004, 20, 1, 20), (2**40, 2**31 - 1, 2**20, 2**31)]
    for codec in CODECS.values():
        made = chunk_footer.metadata(chunks, codec)
        own = pq.read_metadata(pa.BufferReader(b"PAR1" + chunk_footer.footer(chunks, codec)))
        assert made.equals(own) and made.num_row_groups == 3
        assert [made.row_group(i).column(0).data_page_offset for i in range(3)] == [
            c[0] for c in chunks]
        assert made.row_group(2).num_rows == 2**20


def test_a_crafted_container_size_ends_at_the_data() -> None:
    """A page header field the reader skips, crafted as a list of 2**32 bools (a bool in a
    list is a byte): the skip ends at the header's end instead of looping 2**32 times (run in
    a child with a deadline, so that a loop fails the test rather than hanging it)."""
    code = """
from storage.format.chunk_footer import ChunkFormatError, page_values
header = bytes([0x15, 0x00,  # type: DATA_PAGE
                0x69, 0xF1, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F])  # field 6: list<bool> of 2**32
for tail, want in ((50, "past the chunk"), (1 << 17, "over 65,536 bytes")):
    try:
        page_values(header + b"\\x01" * tail)
    except ChunkFormatError as exc:
        assert want in str(exc), exc
    else:
        raise AssertionError("no error")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
