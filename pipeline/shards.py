"""Write one Parquet feature shard: token ids as list<int32>, row groups sized by tokens, zstd.

The shard is built in memory and written with one atomic put, so a crashed worker never leaves
a half-written object under a final name, and its checksum is known before the upload.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.plan import close_at_target
from storage import ObjectInfo, ReplicaSet, RowGroupInfo, ShardInfo, digest_bytes

SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
])
SCHEMA_DESCRIPTION = {"doc_id": "string", "input_ids": "list<int32>"}


def row_group_bounds(token_counts: Sequence[int], target_tokens: int) -> list[tuple[int, int]]:
    """Split documents into consecutive row groups of about ``target_tokens`` tokens each."""
    return close_at_target(token_counts, target_tokens)


def _list_array(ids: Sequence[np.ndarray]) -> pa.ListArray:
    lengths = np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))


def list_array(lengths: np.ndarray, values: np.ndarray) -> pa.ListArray:
    """An Arrow ``list<int32>`` from per-row lengths and the flat values."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))


def shard_table(doc_ids: Sequence[str] | pa.Array, input_ids: pa.ListArray) -> pa.Table:
    ids = doc_ids if isinstance(doc_ids, pa.Array) else pa.array(list(doc_ids), pa.string())
    return pa.Table.from_arrays([ids, input_ids], schema=SCHEMA)


def encode_table(table: pa.Table, target_rg_tokens: int,
                 path: str = "shard.parquet") -> tuple[bytes, ShardInfo]:
    """The Parquet bytes of one shard and its manifest entry.

    The entry locates each row group's ``input_ids`` column chunk (offset, length, sha256) and
    the footer, so that a reader fetches and verifies exactly what it decodes. The table is
    made contiguous first: the bytes must depend on the rows only, not on how they were chunked.
    """
    table = table.combine_chunks()
    col = table.column("input_ids").chunk(0) if table.num_rows else None
    counts = (np.diff(col.offsets.to_numpy()) if col is not None
              else np.zeros(0, dtype=np.int64)).tolist()
    sink = pa.BufferOutputStream()
    bounds = row_group_bounds(counts, target_rg_tokens)
    # Token ids are stored plain (no dictionary: a 50k-entry dictionary buys nothing after
    # zstd and costs a decode step); pages of 1 MiB keep decoding in large vectorised runs.
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
        groups.append(RowGroupInfo(rows=hi - lo, tokens=int(sum(counts[lo:hi])), offset=start,
                                   length=length, sha256=digest_bytes(data[start:start + length])))
    footer_length = meta.serialized_size + 8
    info = ShardInfo(path=path, rows=table.num_rows, tokens=int(sum(counts)), bytes=len(data),
                     sha256=digest_bytes(data), row_groups=tuple(groups),
                     footer_length=footer_length,
                     footer_sha256=digest_bytes(data[len(data) - footer_length:]))
    return data, info


def encode_shard(doc_ids: Sequence[str], ids: Sequence[np.ndarray], target_rg_tokens: int,
                 path: str = "shard.parquet") -> tuple[bytes, ShardInfo]:
    """:func:`encode_table` for documents given as one array of token ids each."""
    return encode_table(shard_table(doc_ids, _list_array(ids)), target_rg_tokens, path)


def write_shard(store: ReplicaSet, relative: str, doc_ids: Sequence[str],
                ids: Sequence[np.ndarray], target_rg_tokens: int) -> ShardInfo:
    data, info = encode_shard(doc_ids, ids, target_rg_tokens, relative)
    store.put(relative, data)
    return info


def write_quarantine(store: ReplicaSet, relative: str, records: Sequence[dict]) -> ObjectInfo:
    """Rejected records as JSON lines: source (file:line), reason, detail and the raw text."""
    body = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
    data = body.encode("utf-8")
    store.put(relative, data)
    return ObjectInfo(path=relative, bytes=len(data), sha256=digest_bytes(data))
