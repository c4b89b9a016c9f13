"""Dedup decisions: pure functions over key entries, independent of bucketing and order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.dedup import (
    KIND_EXACT,
    KIND_NEAR,
    MinHasher,
    components,
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


@settings(max_examples=150)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=80),
       st.integers(1, 6))
def test_large_and_small_star_steps_reach_the_components_whatever_the_buckets(
        pairs: list[tuple[int, int]], buckets: int) -> None:
    """Steps run a bucket of nodes at a time, as the shuffle runs them, stop after two steps
    in a row change nothing; the stars' leaves are every node but its component's smallest."""
    pairs = [(a, b) for a, b in pairs if a != b]
    a = np.array([p[0] for p in pairs], dtype=np.uint64)
    b = np.array([p[1] for p in pairs], dtype=np.uint64)
    records, _ = components.route(a, b, 0, buckets)
    step = still = 0
    while len(records):
        which = components.bucket_of(records["key"], buckets)
        out = [components.step(records[which == k], step) for k in range(buckets)]
        records, _ = components.route(np.concatenate([o[0] for o in out]),
                                      np.concatenate([o[1] for o in out]), step + 1, buckets)
        step += 1
        still = still + 1 if sum(o[2] for o in out) == 0 else 0
        assert len(records) <= 2 * len(pairs)  # edges never outnumber the first step's
        if still == 2:
            break
        assert step < 60
    ref = components.components_reference(a, b)
    want = sorted(x for x, root in ref.items() if x != root)
    assert (components.leaves(records).tolist() if len(records) else []) == want


def test_star_edges_join_each_key_to_its_smallest_document() -> None:
    e = entries([content_key(k) for k in "xyxxz"], [3, 1, 0, 2, 4], [KIND_NEAR] * 5, part=2)
    e["part"][2] = 1  # (1, 0) is the smallest holder of "x"
    a, b = components.star_edges(e)
    got = sorted(zip(components.where(a)[1].tolist(), components.where(b)[1].tolist(),
                     strict=True))
    assert got == [(2, 0), (3, 0)]  # "y" and "z" are held once: no edge
