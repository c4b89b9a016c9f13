"""Connected components of the near-duplicate graph, a bucket of nodes at a time (pure NumPy).

A node is a document, ``part << 32 | pos``, so node order is ``(partition, position)`` order:
the order of the documents in the input whatever its partitioning. Documents sharing a MinHash
LSH band key are connected (:func:`star_edges`: a star to the smallest of them is enough). The
components are found with the alternating *Large-Star* / *Small-Star* operations of Kiveris et
al. ("Connected Components in MapReduce and Beyond", SoCC 2014): each is a function of one
node's edges, so a step is one shuffle of edges by node bucket, edges never outnumber the
first step's, and O(log² n) steps reach a fixpoint where every component is a star centred on
its smallest node. That node survives; the others (the stars' leaves) are near-duplicates.

Records are directed: ``key`` is the node whose bucket holds the record, ``other`` its
neighbour. Large-Star reads both directions of each edge; Small-Star reads each edge once,
at its larger end. :func:`route` writes a step's output for the next one.
"""

from __future__ import annotations

import numpy as np

#: one edge as the node bucket ``bucket(key)`` holds it
EDGE = np.dtype([("key", "<u8"), ("other", "<u8")])
#: steps alternate: even ones are Large-Star, odd ones Small-Star
LARGE, SMALL = 0, 1
_MIX = np.uint64(0x9E3779B97F4A7C15)


def nodes(part: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Node ids, ordered as ``(partition, position)``."""
    return (part.astype(np.uint64) << np.uint64(32)) | pos.astype(np.uint64)


def where(node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(partition, position)`` of node ids."""
    node = node.astype(np.uint64)
    return (node >> np.uint64(32)).astype(np.uint32), (node & np.uint64(0xFFFFFFFF)).astype(
        np.uint32)


def bucket_of(node: np.ndarray, buckets: int) -> np.ndarray:
    """A node's bucket: a multiplicative hash, so consecutive documents spread out."""
    with np.errstate(over="ignore"):
        mixed = node.astype(np.uint64) * _MIX
    return ((mixed >> np.uint64(32)) % np.uint64(buckets)).astype(np.int64)


def star_edges(near: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` undirected edges from ``ENTRY`` records of band keys: every document that
    shares a key with a smaller one, to the smallest document holding that key."""
    if len(near) == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    n = nodes(near["part"], near["pos"])
    order = np.lexsort((n, near["k1"], near["k0"]))
    k0, k1, n = near["k0"][order], near["k1"][order], n[order]
    start = np.ones(len(n), dtype=bool)
    start[1:] = (k0[1:] != k0[:-1]) | (k1[1:] != k1[:-1])
    first = n[np.maximum.accumulate(np.where(start, np.arange(len(n)), 0))]
    keep = n != first  # not the key's smallest document (nor a repeat of it)
    return n[keep], first[keep]


def route(a: np.ndarray, b: np.ndarray, step: int, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Undirected edges ``(a, b)`` as records for ``step`` (both directions for Large-Star,
    the larger end for Small-Star), ordered by bucket; returns them and each bucket's count."""
    if step % 2 == LARGE:
        key, other = np.concatenate([a, b]), np.concatenate([b, a])
    else:
        key, other = np.maximum(a, b), np.minimum(a, b)
    out = np.zeros(len(key), dtype=EDGE)
    out["key"], out["other"] = key, other
    which = bucket_of(key, buckets)
    order = np.lexsort((out["other"], out["key"], which))
    return out[order], np.bincount(which, minlength=buckets).astype(np.int64)


def _grouped(records: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct records sorted by (key, other), where each key's run starts, and its index."""
    r = np.unique(records)  # structured: sorted by key, then other
    start = np.ones(len(r), dtype=bool)
    start[1:] = r["key"][1:] != r["key"][:-1]
    return r, start, np.cumsum(start) - 1


def step(records: np.ndarray, kind: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One Large-Star (``kind`` even) or Small-Star step over one bucket's records.

    Returns the undirected edges ``(a, b)`` it emits and how many nodes changed their edges
    (0 everywhere for a step: the edge set is its fixpoint).
    """
    if len(records) == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64), 0
    r, start, group = _grouped(records)
    key, other = r["key"], r["other"]
    lowest = other[start]  # each key's smallest neighbour (sorted)
    if kind % 2 == LARGE:
        # every larger neighbour joins the smallest of the node's closed neighbourhood
        m = np.minimum(key[start], lowest)[group]
        larger = other > key
        changed = np.zeros(int(start.sum()), dtype=bool)
        np.logical_or.at(changed, group, larger & (m < key))
        return other[larger], m[larger], int(changed.sum())
    # Small-Star: records sit at their larger end, so every neighbour here is smaller; the
    # node and its neighbours join the smallest of them
    m = lowest[group]
    degree = np.bincount(group)
    a = np.concatenate([other, key[start]])
    b = np.concatenate([m, lowest])
    keep = a != b
    return a[keep], b[keep], int((degree > 1).sum())


def leaves(records: np.ndarray) -> np.ndarray:
    """At the fixpoint, the nodes with a smaller neighbour: every node of a component but its
    smallest. Sorted, distinct."""
    return np.unique(records["key"][records["key"] > records["other"]])


def leaf_centres(records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At the fixpoint, :func:`leaves` and, for each, its smallest neighbour: the centre of
    its star, the document it is a near-duplicate of."""
    leaf = records[records["key"] > records["other"]]
    if len(leaf) == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    leaf = leaf[np.lexsort((leaf["other"], leaf["key"]))]
    first = np.ones(len(leaf), dtype=bool)
    first[1:] = leaf["key"][1:] != leaf["key"][:-1]
    return leaf["key"][first], leaf["other"][first]


def components_reference(a: np.ndarray, b: np.ndarray) -> dict[int, int]:
    """``{node: smallest node of its component}`` by union-find in memory (tests, benchmarks)."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        root = x
        while parent.setdefault(root, root) != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        rx, ry = find(x), find(y)
        if rx != ry:
            parent[max(rx, ry)] = min(rx, ry)
    return {x: find(x) for x in list(parent)}
