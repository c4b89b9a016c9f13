"""Finding documents in a dataset's shards: by doc id or source, and by phase-1 place.

A kept document is found by reading the id columns of the shards (``doc_id``, and ``source``
where the run wrote one) a row group at a time, by ranged reads after each shard's verified
footer (the card's reader, :mod:`pipeline.output.signal_summary`): a trace reads O(dataset
ids), never the tokens but the found row group's. A duplicate's record names the document it
duplicates by its phase-1 place ``[partition, row]``; the kept document there is the
partition's shard's row ``row - (duplicates of that partition before it)`` (phase 2 drops
rows, the steps drop documents before they get a row), read from that partition's
duplicates record, which also says where that row went when the shard was ordered by a
column (``--cluster-by``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from pipeline.lineage import records
from pipeline.output.signal_summary import read_shard
from storage import Manifest, ObjectInfo, ReplicaSet, ShardInfo, tokens
from storage.io.index_store import drop_records_of, shards_of


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


def _groups(shard: ShardInfo) -> list[tuple[int, int, Any]]:
    """Every row group of a shard, whole (``(group, rows, no mask)``)."""
    return [(g, info.rows, None) for g, info in enumerate(shard.row_groups)]


def _row(store: ReplicaSet, manifest: Manifest, shard: ShardInfo, row: int) -> Found:
    """Row ``row`` of a shard: every column of its row group read (its footer verified),
    the tokens counted from ``input_ids``' offsets."""
    at = 0
    for g, info in enumerate(shard.row_groups):
        if row < at + info.rows:
            (table,) = read_shard(store, shard, [(g, info.rows, None)], list(manifest.schema))
            one = table.slice(row - at, 1)
            columns = {name: one.column(name)[0].as_py() for name in one.column_names
                       if name != "input_ids"}
            count = int(tokens.lengths(one.column("input_ids"),
                                       manifest.schema.get("input_ids", ""))[0])
            return Found(shard.path, row, g, count, columns)
        at += info.rows
    raise IndexError(f"{shard.path} has no row {row}")


def find_kept(store: ReplicaSet, manifest: Manifest, key: str, by: str = "doc_id"
              ) -> Found | None:
    """The kept document whose ``by`` (``doc_id`` or ``source``) is ``key``, or ``None``.

    Only the id columns are read (each shard's footer, then its row groups' ``doc_id``
    chunks, and ``source`` ones for ``by="source"``). ``by="source"`` also matches the doc id:
    where the id is the source (the default) there is no second copy, and a mixed run's
    non-web documents have a null ``source``."""
    names = ["doc_id", "source"] if by == "source" and "source" in manifest.schema \
        else ["doc_id"]
    for shard in shards_of(store, manifest):
        at = 0
        for table in read_shard(store, shard, _groups(shard), names):
            match = None
            for name in names:
                if name in table.column_names:
                    hit = pc.equal(table.column(name), key).fill_null(False)
                    match = hit if match is None else pc.or_(match, hit)
            hits = np.flatnonzero(np.asarray(match)) if match is not None else []
            if len(hits):
                return _row(store, manifest, shard, at + int(hits[0]))
            at += table.num_rows
    return None


def shard_of_partition(store: ReplicaSet, manifest: Manifest, part: int) -> ShardInfo | None:
    """The shard phase 2 wrote for partition ``part`` (``None``: it kept nothing)."""
    for shard in shards_of(store, manifest):
        if records.partition_of(shard.path) == part:
            return shard
    return None


def dups_record(store: ReplicaSet, drops: Sequence[ObjectInfo], part: int
                ) -> tuple[list[dict[str, Any]], np.ndarray | None]:
    """Partition ``part``'s duplicates record among a version's drop records ``drops`` (its
    list, read once by the caller: :func:`storage.io.index_store.drop_records_of`): its
    duplicates (``[]``: none), and where a clustered shard put phase 1's kept rows (``None``:
    in their order; :func:`pipeline.lineage.records.order_line`)."""
    for obj in drops:
        if records.partition_of(obj.path) == part and records.kind_of(obj.path) == records.DUPS:
            lines = list(records.decode(store.get(obj.path, sha256=obj.sha256), obj.path))
            order = records.order_of(lines, obj.path)
            return ([line for line in lines if "order" not in line],
                    None if order is None else np.asarray(order, dtype=np.int64))
    return [], None



#: the most duplicates a chain of "duplicate of" may pass through before it is a loop
MAX_CHAIN = 64


def kept_at(store: ReplicaSet, manifest: Manifest, part: int, pos: int,
            drops: Sequence[ObjectInfo] | None = None) -> Found | None:
    """The kept document at phase-1 place ``(part, pos)``, following the chain when that
    document was itself dropped as a duplicate (exact copies of a near-duplicate); ``drops``:
    the version's drop records when the caller has read their list already."""
    if drops is None:
        drops = drop_records_of(store, manifest)
    for _ in range(MAX_CHAIN):
        dups, order = dups_record(store, drops, part)
        before = sum(1 for d in dups if d["p"] < pos)
        same = next((d for d in dups if d["p"] == pos), None)
        if same is not None:
            part, pos = same["k"]
            continue
        shard = shard_of_partition(store, manifest, part)
        if shard is None:
            return None
        kept = pos - before  # its row among the kept, in phase 1's order
        rows = sum(g.rows for g in shard.row_groups)
        if not 0 <= kept < rows:
            raise ValueError(f"{shard.path} has no row {kept} (a damaged or crafted drop "
                             "record)")
        if order is not None:  # a clustered shard (--cluster-by): where that row went
            if len(order) != rows:
                raise ValueError(f"{shard.path}: its lineage orders {len(order):,} rows, the "
                                 f"shard holds {rows:,} (a damaged or crafted drop record)")
            kept = int(order[kept])  # a permutation of the rows (records.order_of)
        return _row(store, manifest, shard, kept)
    return None
