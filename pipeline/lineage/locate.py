"""Finding documents in a dataset's shards: by doc id or source, and by phase-1 place.

A kept document is found by reading the id columns of the shards (``doc_id``, and ``source``
where the run wrote one) a shard at a time: a trace reads O(dataset ids), never the tokens,
and holds one shard's ids. A duplicate's record names the document it duplicates by its
phase-1 place ``[partition, row]``; the kept document there is the partition's shard's row
``row - (duplicates of that partition before it)`` (phase 2 drops rows, the steps drop
documents before they get a row), read from that partition's duplicates record.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.lineage import records
from storage import Manifest, ReplicaSet, ShardInfo, tokens
from storage.io.index_store import shards_of

#: columns a trace never prints as a signal (the tokens are counted, not shown)
_IDS = ("doc_id", "input_ids")


@dataclass
class Found:
    """A kept document: where it is and its row (every column but the tokens)."""

    shard: str
    row: int
    row_group: int
    tokens: int
    columns: dict[str, Any] = field(default_factory=dict)

    @property
    def doc_id(self) -> str:
        return str(self.columns.get("doc_id"))


def _open(store: ReplicaSet, shard: ShardInfo) -> pq.ParquetFile:
    """A shard, its bytes verified against the manifest's sha256."""
    return pq.ParquetFile(io.BytesIO(store.get(shard.path, sha256=shard.sha256)))


def _row(pf: pq.ParquetFile, shard: ShardInfo, row: int, encoding: str) -> Found:
    """Row ``row`` of an open shard with its row group and token count."""
    at = 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if row < at + n:
            table = pf.read_row_group(g).slice(row - at, 1)
            columns = {name: table.column(name)[0].as_py() for name in table.column_names
                       if name != "input_ids"}
            count = int(tokens.lengths(table.column("input_ids"), encoding)[0])
            return Found(shard.path, row, g, count, columns)
        at += n
    raise IndexError(f"{shard.path} has no row {row}")


def find_kept(store: ReplicaSet, manifest: Manifest, key: str, by: str = "doc_id"
              ) -> Found | None:
    """The kept document whose ``by`` (``doc_id`` or ``source``) is ``key``, or ``None``.

    ``by="source"`` reads the ``source`` column where a shard has one, else the doc id (a
    run whose ids are their sources keeps no second copy)."""
    encoding = manifest.schema.get("input_ids", "")
    for shard in shards_of(store, manifest):
        pf = _open(store, shard)
        names = pf.schema_arrow.names
        column = "source" if by == "source" and "source" in names else "doc_id"
        ids = pf.read(columns=[column]).column(0)
        hits = np.flatnonzero(np.asarray(pc.equal(ids, key).fill_null(False)))
        if len(hits):
            return _row(pf, shard, int(hits[0]), encoding)
    return None


def shard_of_partition(store: ReplicaSet, manifest: Manifest, part: int) -> ShardInfo | None:
    """The shard phase 2 wrote for partition ``part`` (``None``: it kept nothing)."""
    for shard in shards_of(store, manifest):
        if records.partition_of(shard.path) == part:
            return shard
    return None


def dups_of(store: ReplicaSet, manifest: Manifest, part: int) -> list[dict[str, Any]]:
    """Partition ``part``'s duplicates record (``[]``: none)."""
    for obj in manifest.drops:
        if records.partition_of(obj.path) == part and records.kind_of(obj.path) == records.DUPS:
            return list(records.decode(store.get(obj.path, sha256=obj.sha256)))
    return []


#: the most duplicates a chain of "duplicate of" may pass through before it is a loop
MAX_CHAIN = 64


def kept_at(store: ReplicaSet, manifest: Manifest, part: int, pos: int) -> Found | None:
    """The kept document at phase-1 place ``(part, pos)``, following the chain when that
    document was itself dropped as a duplicate (exact copies of a near-duplicate)."""
    for _ in range(MAX_CHAIN):
        dups = dups_of(store, manifest, part)
        before = sum(1 for d in dups if d["p"] < pos)
        same = next((d for d in dups if d["p"] == pos), None)
        if same is not None:
            part, pos = same["k"]
            continue
        shard = shard_of_partition(store, manifest, part)
        if shard is None:
            return None
        return _row(_open(store, shard), shard, pos - before,
                    manifest.schema.get("input_ids", ""))
    return None
