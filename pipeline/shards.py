"""Write one Parquet feature shard: token ids as list<int32>, row groups sized by tokens, zstd.

The shard is built in memory and written with one atomic put, so a crashed worker never leaves
a half-written object under a final name, and its checksum is known before the upload.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from storage import Location, RowGroupInfo, ShardInfo, digest_bytes, write_atomic

SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
])
SCHEMA_DESCRIPTION = {"doc_id": "string", "input_ids": "list<int32>"}


def row_group_bounds(token_counts: Sequence[int], target_tokens: int) -> list[tuple[int, int]]:
    """Split documents into consecutive row groups of about ``target_tokens`` tokens each.

    A row group closes as soon as it reaches the target, so groups hold at least the target
    (except the last) and at most the target plus one document.
    """
    bounds: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, n in enumerate(token_counts):
        acc += n
        if acc >= target_tokens:
            bounds.append((start, i + 1))
            start, acc = i + 1, 0
    if start < len(token_counts):
        bounds.append((start, len(token_counts)))
    return bounds


def _list_array(ids: Sequence[np.ndarray]) -> pa.ListArray:
    lengths = np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))


def encode_shard(doc_ids: Sequence[str], ids: Sequence[np.ndarray],
                 target_rg_tokens: int) -> tuple[bytes, list[RowGroupInfo]]:
    """The Parquet bytes of one shard and its row groups' row and token counts."""
    counts = [len(a) for a in ids]
    sink = pa.BufferOutputStream()
    groups: list[RowGroupInfo] = []
    with pq.ParquetWriter(sink, SCHEMA, compression="zstd", compression_level=3,
                          write_statistics=False, store_schema=False) as writer:
        for lo, hi in row_group_bounds(counts, target_rg_tokens):
            table = pa.Table.from_arrays(
                [pa.array(list(doc_ids[lo:hi]), type=pa.string()), _list_array(ids[lo:hi])],
                schema=SCHEMA)
            writer.write_table(table, row_group_size=hi - lo)
            groups.append(RowGroupInfo(rows=hi - lo, tokens=int(sum(counts[lo:hi]))))
    return sink.getvalue().to_pybytes(), groups


def write_shard(loc: Location, relative: str, doc_ids: Sequence[str], ids: Sequence[np.ndarray],
                target_rg_tokens: int) -> ShardInfo:
    data, groups = encode_shard(doc_ids, ids, target_rg_tokens)
    write_atomic(loc, relative, data)
    return ShardInfo(path=relative, rows=len(ids), tokens=int(sum(len(a) for a in ids)),
                     bytes=len(data), sha256=digest_bytes(data), row_groups=tuple(groups))


def write_quarantine(loc: Location, relative: str, records: Sequence[dict]) -> None:
    """Rejected records as JSON lines: source (file:line), reason, detail and the raw text."""
    body = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
    write_atomic(loc, relative, body.encode("utf-8"))
