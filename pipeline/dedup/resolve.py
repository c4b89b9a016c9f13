"""Decide duplicates from key entries: pure NumPy, one bucket at a time.

Correct per bucket because equal keys always land in the same bucket; the result does not
depend on how entries are bucketed or ordered, which the property tests check.
"""

from __future__ import annotations

import numpy as np

#: a condemned document: where it is, the strongest reason (0 exact beats 1 near), and the
#: document it duplicates (``keep_part``, ``keep_pos``: the smallest holding its key, or its
#: near-dup cluster's centre), so that ``python -m pipeline trace --dropped`` can name the
#: kept document (the lineage record phase 2 writes: :mod:`pipeline.lineage.records`)
DROP = np.dtype([("part", "<u4"), ("pos", "<u4"), ("kind", "u1"), ("keep_part", "<u4"),
                 ("keep_pos", "<u4")])


def split_by_bucket(entries: np.ndarray, buckets: int) -> list[np.ndarray]:
    """Entries routed by key: bucket ``k0 % buckets``."""
    which = entries["k0"] % np.uint64(buckets)
    return [entries[which == b] for b in range(buckets)]


def resolve(entries: np.ndarray) -> np.ndarray:
    """Every document that shares a key with a document at a smaller (partition, position).

    One row per condemned document, sorted by (part, pos), with the smallest kind among the
    keys that condemned it.
    """
    if len(entries) == 0:
        return np.zeros(0, dtype=DROP)
    order = np.lexsort((entries["pos"], entries["part"], entries["k1"], entries["k0"]))
    e = entries[order]
    same = np.zeros(len(e), dtype=bool)
    same[1:] = (e["k0"][1:] == e["k0"][:-1]) & (e["k1"][1:] == e["k1"][:-1])
    # a document never condemns itself (identical band keys within one document)
    same[1:] &= (e["part"][1:] != e["part"][:-1]) | (e["pos"][1:] != e["pos"][:-1])
    new_key = np.ones(len(e), dtype=bool)
    new_key[1:] = (e["k0"][1:] != e["k0"][:-1]) | (e["k1"][1:] != e["k1"][:-1])
    # each entry's key's first (smallest) document: the one a condemned document duplicates
    first = np.maximum.accumulate(np.where(new_key, np.arange(len(e)), 0))
    d = e[same]
    keeper = e[first[same]]
    out = np.zeros(len(d), dtype=DROP)
    out["part"], out["pos"], out["kind"] = d["part"], d["pos"], d["kind"]
    out["keep_part"], out["keep_pos"] = keeper["part"], keeper["pos"]
    return merge_drops(out)


def merge_drops(drops: np.ndarray) -> np.ndarray:
    """One row per condemned document, sorted by (part, pos), with its smallest kind."""
    d = drops[np.lexsort((drops["kind"], drops["pos"], drops["part"]))]
    first = np.ones(len(d), dtype=bool)
    first[1:] = (d["part"][1:] != d["part"][:-1]) | (d["pos"][1:] != d["pos"][:-1])
    return d[first]
