"""Write one Parquet feature shard: token ids per document, row groups sized by tokens, zstd.

How ids are encoded in ``input_ids`` (little-endian uint16/uint32 in one binary value per
document) is the storage format's business: :mod:`storage.tokens`.

The shard is built in memory and written with one atomic put, so a crashed worker never leaves
a half-written object under a final name, and its checksum is known before the upload.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.plan import close_at_target
from storage import RowGroupInfo, ShardInfo, digest_bytes, tokens
from storage.format.checksums import piece_digest

SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("input_ids", pa.binary(), nullable=False),
])
#: ids of vocabularies up to 65,536 entries (GPT-2's is 50,257)
GPT2_DTYPE = np.dtype("<u2")


def schema_description(dtype: np.dtype) -> dict[str, str]:
    """The manifest's ``schema``: column names to their types / token encodings."""
    return {"doc_id": "string", "input_ids": tokens.encoding_name(dtype)}


def row_group_bounds(token_counts: Sequence[int], target_tokens: int) -> list[tuple[int, int]]:
    """Split documents into consecutive row groups of about ``target_tokens`` tokens each."""
    return close_at_target(token_counts, target_tokens)


def token_column(ids: Sequence[np.ndarray], dtype: np.dtype) -> pa.BinaryArray:
    """The ``input_ids`` column of documents given as one array of ids each."""
    lengths = np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids))
    values = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    return tokens.pack(lengths, values, dtype)


def shard_table(doc_ids: Sequence[str] | pa.Array, input_ids: pa.BinaryArray) -> pa.Table:
    ids = doc_ids if isinstance(doc_ids, pa.Array) else pa.array(list(doc_ids), pa.string())
    return pa.Table.from_arrays([ids, input_ids], schema=SCHEMA)


def encode_table(table: pa.Table, dtype: np.dtype, target_rg_tokens: int,
                 path: str = "shard.parquet") -> tuple[bytes, ShardInfo]:
    """The Parquet bytes of one shard and its manifest entry.

    The entry locates each row group's ``input_ids`` column chunk (offset, length, sha256) and
    the footer, so that a reader fetches and verifies exactly what it decodes. The table is
    made contiguous first: the bytes must depend on the rows only, not on how they were chunked.
    """
    table = table.combine_chunks()
    counts = tokens.lengths(table.column("input_ids"), tokens.encoding_name(dtype)).tolist()
    sink = pa.BufferOutputStream()
    bounds = row_group_bounds(counts, target_rg_tokens)
    # Token ids are stored plain (no dictionary: it buys nothing after zstd and costs a
    # decode step); pages of 1 MiB keep decoding in large runs.
    with pq.ParquetWriter(sink, SCHEMA, compression="zstd", compression_level=3,
                          use_dictionary=["doc_id"], data_page_size=1 << 20,
                          write_statistics=False, store_schema=False) as writer:
        for lo, hi in bounds:
            writer.write_table(table.slice(lo, hi - lo), row_group_size=hi - lo)
    data = sink.getvalue().to_pybytes()
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    column = SCHEMA.get_field_index("input_ids")
    groups = []
    for i, (lo, hi) in enumerate(bounds):
        chunk = meta.row_group(i).column(column)
        start = (chunk.dictionary_page_offset if chunk.has_dictionary_page
                 else chunk.data_page_offset)
        length = chunk.total_compressed_size
        piece = memoryview(data)[start:start + length]
        groups.append(RowGroupInfo(rows=hi - lo, tokens=int(sum(counts[lo:hi])), offset=start,
                                   length=length, blake3=piece_digest(piece)))
    footer_length = meta.serialized_size + 8
    info = ShardInfo(path=path, rows=table.num_rows, tokens=int(sum(counts)), bytes=len(data),
                     sha256=digest_bytes(data), row_groups=tuple(groups),
                     footer_length=footer_length,
                     footer_sha256=digest_bytes(data[len(data) - footer_length:]))
    return data, info


def encode_shard(doc_ids: Sequence[str], ids: Sequence[np.ndarray], target_rg_tokens: int,
                 path: str = "shard.parquet",
                 dtype: np.dtype = GPT2_DTYPE) -> tuple[bytes, ShardInfo]:
    """:func:`encode_table` for documents given as one array of token ids each."""
    return encode_table(shard_table(doc_ids, token_column(ids, dtype)), dtype,
                        target_rg_tokens, path)
