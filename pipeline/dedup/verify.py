"""Verifying LSH candidate pairs on the documents' signatures (pure NumPy).

Two documents that share an LSH band are only *candidates*: the band's S-curve admits pairs
below the threshold (and, set to catch nearly every pair above it, many). Before a candidate
edge joins the connected components, the Jaccard similarity its two MinHash signatures
estimate must reach the threshold, as BigCode's and NeMo Curator's near-dup pipelines check
before their union-find. Phase 1 keeps each document's signature as a *sketch* of ``perms``
bytes (:func:`pipeline.dedup.keys.sketch`: the low 8 bits of each value); the decision is a
function of the two sketches alone, so the verified edges, and the survivors, are the same
whatever the partitioning, buckets, workers or retries.

The shuffle brings the two sketches together in two hops of the edge (``pipeline.dedup.shuffle``):
to the key group holding its larger document, which attaches that document's sketch
(:data:`CARRIED`), then to the group holding its smaller one, which compares.
"""

from __future__ import annotations

import math

import numpy as np

#: 8-bit values agree by chance with this probability when the MinHash values differ
CHANCE = 1 / 256


def carried(perms: int) -> np.dtype:
    """An edge on its way to the group of ``key`` (its smaller document), carrying the sketch
    of ``other`` (its larger one)."""
    return np.dtype([("key", "<u8"), ("other", "<u8"), ("sketch", "u1", (perms,))])


def min_matches(perms: int, threshold: float) -> int:
    """Agreeing sketch values needed for an estimated Jaccard >= ``threshold``.

    ``m`` of ``perms`` values agree with expectation ``perms (J + (1 - J) / 256)``, so the
    estimate is ``(m / perms - 1/256) / (1 - 1/256)``; an integer, so that every worker
    decides alike.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"near-dup threshold must be in (0, 1], not {threshold}")
    # the rounding guard keeps an exact product (e.g. 0.75 x 256) from ceiling up one
    return max(1, math.ceil(perms * (threshold * (1 - CHANCE) + CHANCE) - 1e-9))


def estimate(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Estimated Jaccard of row ``i`` of sketches ``a`` and of ``b`` (``n x perms`` uint8)."""
    agree = (a == b).mean(axis=1) if len(a) else np.zeros(0)
    return (agree - CHANCE) / (1 - CHANCE)


def verified(a: np.ndarray, b: np.ndarray, threshold: float) -> np.ndarray:
    """Which pairs of sketches (rows of ``a`` and ``b``) reach ``threshold``."""
    if len(a) == 0:
        return np.zeros(0, dtype=bool)
    need = min_matches(a.shape[1], threshold)
    return np.count_nonzero(a == b, axis=1) >= need


def rows_of(part: np.ndarray, pos: np.ndarray, lo: int, offsets: np.ndarray) -> np.ndarray:
    """Rows of a key group's sketch matrix (partitions ``lo, lo + 1, ...`` one after another,
    partition ``lo + i`` from row ``offsets[i]``) of documents ``(part, pos)``."""
    return offsets[part.astype(np.int64) - lo] + pos.astype(np.int64)
