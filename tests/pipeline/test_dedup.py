"""Dedup decisions: pure functions over key entries, independent of bucketing and order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.dedup import (
    KIND_EXACT,
    MinHasher,
    content_key,
    entries,
    merge_drops,
    resolve,
    split_by_bucket,
)


def _entries(docs: list[list[int]]) -> np.ndarray:
    """docs[part] = list of small ints; equal ints are equal texts."""
    arrs = [entries([content_key(str(v)) for v in vals], list(range(len(vals))),
                    [KIND_EXACT] * len(vals), part) for part, vals in enumerate(docs)]
    return np.concatenate(arrs)


@settings(max_examples=100)
@given(st.lists(st.lists(st.integers(0, 8), max_size=15), min_size=1, max_size=5),
       st.integers(1, 7), st.randoms())
def test_first_occurrence_survives_whatever_the_buckets(docs: list[list[int]], buckets: int,
                                                        rnd) -> None:
    e = _entries(docs)
    perm = list(range(len(e)))
    rnd.shuffle(perm)
    results = [resolve(piece) for piece in split_by_bucket(e[perm], buckets)]
    seen: set[int] = set()
    expected = []
    for part, vals in enumerate(docs):
        for pos, v in enumerate(vals):
            if v in seen:
                expected.append((part, pos))
            seen.add(v)
    got = [(int(d["part"]), int(d["pos"])) for d in merge_drops(np.concatenate(results))]
    assert got == expected
    assert got == [(int(d["part"]), int(d["pos"])) for d in resolve(e)]


def test_minhash_finds_near_duplicates_only() -> None:
    mh = MinHasher()
    base = " ".join(f"word{i}" for i in range(200))
    near = base.replace("word100", "changed")
    other = " ".join(f"token{i}" for i in range(200))
    keys = [mh.band_keys(t) for t in (base, near, other)]
    assert len(set(keys[0]) & set(keys[1])) >= 1
    assert not set(keys[0]) & set(keys[2])
    assert keys[0] == MinHasher().band_keys(base)  # same seed, same keys on every worker
