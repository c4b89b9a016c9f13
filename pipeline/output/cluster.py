"""Clustered shards: each shard's documents ordered by one column (``--cluster-by``).

Why: a view (``pipeline select``) copies no tokens, so its loader decodes every row group it
keeps a document of, whole. Where the documents it keeps are spread at random (a threshold on
a score nobody ordered by), a view of half the documents decodes every row group for half
its tokens: twice the decode per token of its source (``benchmarks/view_loader.py``). Ordered
by the column a view selects on, a shard's kept documents are one run: the view keeps whole
row groups and leaves out whole ones (at most one row group a shard is split), and its loader
reads and decodes only what it keeps, from an object store too. This is the data-skipping
layout of table formats (a sort key, Z-order) applied to a shard's row groups.

The order is ascending, documents with equal values (and nulls, last) in the order the run
gave them (Arrow's ``sort_indices`` is stable), so it depends only on the partition's
documents: the same bytes on any worker count. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: the column every shard has besides ``input_ids`` (the run's others, web metadata,
#: ``source`` and dedup's, are the callers' to name)
ALWAYS = ("doc_id",)


class ClusterColumnError(ValueError):
    """``--cluster-by`` names a column the shards will not have."""


def cluster_order(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The row order (int64 indices) that sorts ``values`` ascending; equal values, NaNs
    (after every number) and nulls (last) keep their given order."""
    if not len(values):
        return np.zeros(0, dtype=np.int64)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    order = pc.array_sort_indices(values, order="ascending", null_placement="at_end")
    return np.asarray(order, dtype=np.int64)


def rows_of(order: np.ndarray) -> np.ndarray:
    """Where each document went: ``rows[j]`` is the clustered row of the ``j``-th document
    before clustering (the inverse of :func:`cluster_order`'s permutation)."""
    order = np.asarray(order, dtype=np.int64)
    rows = np.empty(len(order), dtype=np.int64)
    rows[order] = np.arange(len(order), dtype=np.int64)
    return rows


def clustered(table: pa.Table, column: str) -> tuple[pa.Table, np.ndarray]:
    """``table``'s rows in :func:`cluster_order` of ``column``, and :func:`rows_of` that
    order; a :class:`ClusterColumnError` naming the columns there are when it has none."""
    if column not in table.column_names:
        raise ClusterColumnError(f"--cluster-by {column!r}: the shard has no such column "
                                 f"(its columns: {', '.join(table.column_names)})")
    if column == "input_ids":
        raise ClusterColumnError("--cluster-by 'input_ids': the token ids are not a column "
                                 "to order documents by")
    order = cluster_order(table.column(column))
    return table.take(pa.array(order)), rows_of(order)


def check_name(column: str, steps: Iterable[str], columns: Iterable[str]) -> None:
    """Before a run: ``column`` must be one the shards can have: one of ``columns`` (the
    run's fixed ones: doc id, web metadata, ``source``, dedup's signals) or a signal of one of
    the recipe's ``steps`` (``<step>.<signal>``). The signal itself is checked once phase 1
    has run (:func:`check_signal`): a step's signals are known from what it emits."""
    fixed = [*ALWAYS, *columns]
    if column in fixed:
        return
    step = column.partition(".")[0]
    names = list(steps)
    if "." in column and step in names:
        return
    raise ClusterColumnError(
        f"--cluster-by {column!r}: not a column this run writes (a step's signal is "
        f"'<step>.<signal>', steps: {', '.join(names) or 'none'}; other columns: "
        f"{', '.join(fixed)})")


def check_signal(column: str, signals: Iterable[str], columns: Iterable[str]) -> None:
    """After phase 1: a step signal ``column`` must be among the ``signals`` the steps wrote
    (a step that never emitted it leaves nothing to order by)."""
    if column in (*ALWAYS, *columns):
        return
    written = sorted(signals)
    if column not in written:
        raise ClusterColumnError(
            f"--cluster-by {column!r}: no step wrote this signal (signals written: "
            f"{', '.join(written) or 'none'})")
