"""Dedup's own signals (``--dedup-signals``): per kept document, how many documents had its
exact text and the size and id of its near-duplicate cluster (pure NumPy).

They are decided where the duplicates are, in the shuffle (``pipeline.dedup.shuffle``), never by
gathering keys: each bucket writes, besides the documents it condemns, a *note* per survivor
of a key shared by several documents (:func:`exact_notes`: how many share it), and each node
bucket at the components' fixpoint a note per component centre with how many of the centre's
leaves it holds (:func:`cluster_notes`; a component's leaves lie in several buckets, so
these are partial counts). Notes travel to the survivor's key group like drops do, are summed
there per document (:func:`merge_notes`) and picked by the survivor's partition in phase 2,
which turns them into columns (:func:`columns`). Only documents with a duplicate get a note,
so notes never outnumber drops.

The columns, ``int64``, on every kept document:

- ``dedup.exact_count`` (``--dedup exact``): the documents of the whole input with exactly its
  cleaned text, itself included (1: unique). Exact duplicates dropped by a near-dup cluster
  still count.
- ``dedup.cluster_id`` (``--near-dup``): its near-duplicate cluster's id, the node
  ``partition << 32 | position`` (:func:`pipeline.dedup.components.nodes`; position: the row
  in phase 1's rows of that partition) of the cluster's survivor, its smallest document. The
  survivor is the kept document itself, so the id is its own node: distinct across clusters,
  singletons included (their cluster is themselves), and the same for the same input and
  partitioning whatever the workers, buckets or retries.
- ``dedup.cluster_size`` (``--near-dup``): the documents of its connected component of the
  verified near-duplicate graph, itself included (1: alone); its exact copies are members.
"""

from __future__ import annotations

import numpy as np

from pipeline.dedup.components import nodes

#: a note on a survivor: where it is, what it counts, and the count (partial for clusters)
NOTE = np.dtype([("part", "<u4"), ("pos", "<u4"), ("kind", "u1"), ("value", "<i8")])
#: ``kind``: the documents sharing the survivor's exact key; leaves of its near-dup component
NOTE_EXACT, NOTE_CLUSTER = 0, 1

EXACT_COUNT = "dedup.exact_count"
CLUSTER_ID = "dedup.cluster_id"
CLUSTER_SIZE = "dedup.cluster_size"
#: the Parquet type of every dedup signal
TYPE = "int64"


def names(exact: bool, near: bool) -> tuple[str, ...]:
    """The columns a run writes: the exact count with exact dedup, the cluster's id and size
    with near-dup (in this order, after every other column)."""
    return (EXACT_COUNT,) * exact + (CLUSTER_ID, CLUSTER_SIZE) * near


def exact_notes(entries: np.ndarray) -> np.ndarray:
    """For each exact key of one bucket's ``ENTRY`` records held by several documents, a note
    on its survivor (the smallest ``(partition, position)``) with how many hold it; sorted by
    ``(part, pos)``. Complete per bucket: equal keys land in the same bucket."""
    if len(entries) == 0:
        return np.zeros(0, dtype=NOTE)
    e = entries[np.lexsort((entries["pos"], entries["part"], entries["k1"], entries["k0"]))]
    n = len(e)
    new_key = np.ones(n, dtype=bool)
    new_key[1:] = (e["k0"][1:] != e["k0"][:-1]) | (e["k1"][1:] != e["k1"][:-1])
    new_doc = new_key.copy()  # a document counted once, whatever entries repeat it
    new_doc[1:] |= (e["part"][1:] != e["part"][:-1]) | (e["pos"][1:] != e["pos"][:-1])
    first = np.flatnonzero(new_key)
    docs = np.add.reduceat(new_doc.astype(np.int64), first)
    shared = docs > 1
    out = np.zeros(int(shared.sum()), dtype=NOTE)
    out["part"], out["pos"] = e["part"][first[shared]], e["pos"][first[shared]]
    out["kind"], out["value"] = NOTE_EXACT, docs[shared]
    return out[np.lexsort((out["pos"], out["part"]))]


def cluster_notes(records: np.ndarray) -> np.ndarray:
    """At the components' fixpoint (every component a star on its smallest node), one node
    bucket's ``EDGE`` records: a note per centre with how many of its leaves this bucket
    holds (a leaf's record ``key > other`` lies in the leaf's bucket); sorted by
    ``(part, pos)``."""
    leaf = records[records["key"] > records["other"]]
    if len(leaf) == 0:
        return np.zeros(0, dtype=NOTE)
    leaf = np.unique(leaf)  # by key, then other: a leaf's first record names its centre
    first = np.ones(len(leaf), dtype=bool)
    first[1:] = leaf["key"][1:] != leaf["key"][:-1]
    centre, count = np.unique(leaf["other"][first], return_counts=True)
    out = np.zeros(len(centre), dtype=NOTE)
    out["part"] = (centre >> np.uint64(32)).astype(np.uint32)
    out["pos"] = (centre & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    out["kind"], out["value"] = NOTE_CLUSTER, count
    return out


def merge_notes(notes: np.ndarray) -> np.ndarray:
    """One note per document and kind, the values summed (a centre's partial leaf counts from
    several buckets); sorted by ``(part, pos, kind)``."""
    if len(notes) == 0:
        return np.zeros(0, dtype=NOTE)
    n = notes[np.lexsort((notes["kind"], notes["pos"], notes["part"]))]
    first = np.ones(len(n), dtype=bool)
    first[1:] = ((n["part"][1:] != n["part"][:-1]) | (n["pos"][1:] != n["pos"][:-1])
                 | (n["kind"][1:] != n["kind"][:-1]))
    at = np.flatnonzero(first)
    out = n[at].copy()
    out["value"] = np.add.reduceat(n["value"], at)
    return out


def columns(part: int, rows: int, notes: np.ndarray, wanted: tuple[str, ...]
            ) -> dict[str, np.ndarray]:
    """The dedup columns of all ``rows`` of partition ``part``'s phase-1 shard (the kept ones
    are taken from them), from its notes: by default a count of 1 and a cluster of itself."""
    out: dict[str, np.ndarray] = {}
    pos = notes["pos"].astype(np.int64)
    if pos.size and pos.max() >= rows:
        raise ValueError(f"partition {part}: a dedup note names row {int(pos.max())} of "
                         f"{rows}")
    for name in wanted:
        if name == EXACT_COUNT:
            col = np.ones(rows, dtype=np.int64)
            mine = notes["kind"] == NOTE_EXACT
            col[pos[mine]] = notes["value"][mine]
        elif name == CLUSTER_SIZE:
            col = np.ones(rows, dtype=np.int64)
            mine = notes["kind"] == NOTE_CLUSTER
            col[pos[mine]] += notes["value"][mine]
        elif name == CLUSTER_ID:
            ids = nodes(np.full(rows, part, dtype=np.uint32), np.arange(rows, dtype=np.uint32))
            col = ids.astype(np.int64)  # < 2**63 below 2**31 partitions
        else:
            raise ValueError(f"no dedup signal {name!r}")
        out[name] = col
    return out
