"""The dedup shuffle through a real store: the same drops as resolving every key at once."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.dedup import (
    DROP,
    KIND_EXACT,
    KIND_NEAR,
    components,
    content_key,
    entries,
    merge_drops,
    resolve,
    shuffle,
    verify,
)
from pipeline.tasks import work
from storage import ReplicaSet
from tests.pipeline.dedup._partitions import Doc, flaky, write_partitions


def _keys(vals: list[int], part: int = 0, near: bool = False) -> np.ndarray:
    """An exact key per value, and with ``near`` a MinHash-like one shared by v // 3."""
    exact = entries([content_key(str(v)) for v in vals], list(range(len(vals))),
                    [KIND_EXACT] * len(vals), part)
    if not near:
        return exact
    close = entries([content_key(f"near {v // 3}") for v in vals], list(range(len(vals))),
                    [KIND_NEAR] * len(vals), part)
    return np.concatenate([exact, close])


def _run(store: ReplicaSet, docs: list[list[int]], buckets: int, target: int,
         near: bool) -> list[np.ndarray]:
    """The shuffle as the driver runs it (``shuffle.run``), its tasks in this process, with
    key groups of ``target`` keys; then each partition's drops as phase 2 picks them."""
    keys = [f"k{i}" for i in range(len(docs))]
    for key, vals in zip(keys, docs, strict=True):
        work.save_array(store, work.keys_path(key), _keys(vals, near=near))
    shuffled = shuffle.run(shuffle.in_process, store, "run", keys,
                           [len(v) * (1 + near) for v in docs], buckets, target)
    assert shuffled.buckets == buckets
    assert shuffled.groups == len(shuffle.key_groups([len(v) * (1 + near) for v in docs], target))
    where = shuffled.drops
    return [shuffle.pick(store, where[i]) if i in where else np.zeros(0, dtype=DROP)
            for i in range(len(docs))]


@settings(max_examples=60)
@given(st.lists(st.lists(st.integers(0, 12), max_size=20), min_size=1, max_size=8),
       st.integers(1, 9), st.integers(1, 40), st.booleans())
def test_shuffle_through_the_store_finds_the_same_drops(tmp_path_factory, docs: list[list[int]],
                                                        buckets: int, target: int,
                                                        near: bool) -> None:
    root: Path = tmp_path_factory.mktemp("shuffle")
    store = ReplicaSet.from_urls([str(root)])
    picked = _run(store, docs, buckets, target, near)
    everything = resolve(np.concatenate([_keys(vals, part, near)
                                         for part, vals in enumerate(docs)]))
    for i, got in enumerate(picked):
        assert (got["part"] == i).all()
        want = everything[everything["part"] == i]
        assert got.tolist() == want.tolist()  # sorted by position, strongest reason kept
        assert merge_drops(got).tolist() == want.tolist()  # already one row per document


@given(st.lists(st.integers(0, 10**6), max_size=300), st.integers(1, 5 * 10**6))
def test_key_groups_tile_the_partitions_and_stay_near_the_target(sizes: list[int],
                                                                 target: int) -> None:
    groups = shuffle.key_groups(sizes, target)
    assert [i for lo, hi in groups for i in range(lo, hi)] == list(range(len(sizes)))
    for lo, hi in groups:
        assert hi > lo
        assert sum(sizes[lo:hi - 1]) < target  # closed as soon as it reached the target
    assert all(sum(sizes[lo:hi]) >= target for lo, hi in groups[:-1])


@given(st.integers(0, 10**12))
def test_shuffle_sizes_bound_the_tasks_and_their_number(total_keys: int) -> None:
    per_task, buckets = shuffle.sizes(total_keys)
    assert per_task >= shuffle.TASK_KEYS and 1 <= buckets <= shuffle.MAX_TASKS
    assert buckets * per_task >= total_keys  # every bucket within its task's size, on average
    if total_keys <= shuffle.TASK_KEYS * shuffle.MAX_TASKS:
        assert per_task == shuffle.TASK_KEYS  # small inputs: ~50 MiB tasks, more of them
    # the groups closed at per_task keys number at most total / per_task + 1
    assert total_keys // per_task + 1 <= shuffle.MAX_TASKS + 1


def _survivors_through_the_store(store: ReplicaSet, docs: list[Doc], cuts: list[int],
                                 buckets: int, target: int, rnd,
                                 sketches: np.ndarray | None = None) -> dict[int, int]:
    """``{document: kind}`` of the drops, documents numbered in input order, ``cuts`` the
    partition sizes (the last partition takes the rest); with ``sketches`` (a row per
    document), phase 1's sketch files too, and candidates verified at :data:`THRESHOLD`."""
    bounds, names, per_part = write_partitions(store, docs, cuts, sketches)
    verified = {} if sketches is None else {"threshold": THRESHOLD, "perms": PERMS}
    where = shuffle.run(flaky(rnd), store, f"run{rnd.random()}", names, per_part, buckets,
                        target, **verified).drops
    out = {}
    for p, (lo, _hi) in enumerate(bounds):
        if p in where:
            for d in shuffle.pick(store, where[p]):
                out[lo + int(d["pos"])] = int(d["kind"])
    return out


def _reference(docs: list[Doc], sketches: np.ndarray | None = None) -> dict[int, int]:
    """Exact: a text seen earlier; near: any member of a component of the shared-band graph
    but its first. A document both is an exact duplicate. With ``sketches``, a document
    joins the first holder of its band only when their sketches agree in at least
    ``verify.min_matches`` places."""
    first_band: dict[int, int] = {}
    a, b = [], []
    for i, (_text, bands) in enumerate(docs):
        for band in bands:
            if band not in first_band:
                first_band[band] = i
            elif sketches is None or (np.count_nonzero(
                    sketches[i] == sketches[first_band[band]])
                    >= verify.min_matches(PERMS, THRESHOLD)):
                a.append(i)
                b.append(first_band[band])
    roots = components.components_reference(np.array(a, np.uint64), np.array(b, np.uint64))
    out = {x: KIND_NEAR for x, root in roots.items() if x != root}
    seen: set[int] = set()
    for i, (text, _bands) in enumerate(docs):
        if text in seen:
            out[i] = KIND_EXACT
        seen.add(text)
    return dict(sorted(out.items()))


_docs = st.lists(st.tuples(st.integers(0, 30), st.frozensets(st.integers(0, 25), max_size=3)),
                 max_size=40)


@settings(max_examples=40, deadline=None)
@given(_docs, st.lists(st.integers(1, 12), max_size=6), st.integers(1, 7), st.integers(1, 60),
       st.randoms(use_true_random=False))
def test_near_dup_components_are_the_same_whatever_the_partitioning_buckets_and_failures(
        tmp_path_factory, docs: list[Doc], cuts: list[int], buckets: int, target: int,
        rnd) -> None:
    """Chains of near-duplicates collapse to their first document, through the store, for
    any partitioning, buckets, key groups, task order and reruns."""
    store = ReplicaSet.from_urls([str(tmp_path_factory.mktemp("cc"))])
    got = _survivors_through_the_store(store, docs, cuts, buckets, target, rnd)
    assert dict(sorted(got.items())) == _reference(docs)


#: verification in the property tests: sketches of 8 values, 5 agreeing needed
PERMS, THRESHOLD = 8, 0.6


def _sketches(families: list[tuple[int, frozenset[int]]]) -> np.ndarray:
    """A sketch per document: its family's (one of 3), with the values at ``flips`` its own
    (so two documents of one family agree in 8 minus their flips' union places)."""
    base = np.arange(3 * PERMS, dtype=np.uint8).reshape(3, PERMS)
    out = base[[f for f, _ in families]].copy() if families else np.zeros((0, PERMS), np.uint8)
    for i, (_f, flips) in enumerate(families):
        out[i, sorted(flips)] = 100 + i
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.frozensets(st.integers(0, 12), max_size=3),
                          st.integers(0, 2), st.frozensets(st.integers(0, PERMS - 1),
                                                           max_size=3)),
                max_size=40),
       st.lists(st.integers(1, 12), max_size=6), st.integers(1, 7), st.integers(1, 60),
       st.randoms(use_true_random=False))
def test_verified_near_dup_survivors_are_the_same_whatever_the_partitioning_and_failures(
        tmp_path_factory, docs: list[tuple[int, frozenset[int], int, frozenset[int]]],
        cuts: list[int], buckets: int, target: int, rnd) -> None:
    """Candidates verified on their sketches (two hops through key groups), then components:
    the same survivors as deciding every first-holder edge in memory, for any partitioning,
    buckets, key groups, task order and reruns."""
    plain: list[Doc] = [(text, bands) for text, bands, _f, _x in docs]
    sk = _sketches([(f, flips) for _t, _b, f, flips in docs])
    store = ReplicaSet.from_urls([str(tmp_path_factory.mktemp("verified"))])
    got = _survivors_through_the_store(store, plain, cuts, buckets, target, rnd, sk)
    assert dict(sorted(got.items())) == _reference(plain, sk)


def test_a_candidate_whose_sketch_disagrees_is_not_a_near_duplicate(tmp_path) -> None:
    """B shares a band with A but their sketches agree in 4 of 8 places (< 5): B stays;
    C agrees with A in 7 and goes; without verification both go."""
    docs: list[Doc] = [(0, frozenset({1})), (1, frozenset({1})), (2, frozenset({1}))]
    sk = _sketches([(0, frozenset()), (0, frozenset({0, 1, 2, 3})), (0, frozenset({5}))])
    store = ReplicaSet.from_urls([str(tmp_path)])
    assert _survivors_through_the_store(store, docs, [2], 3, 2, random.Random(1), sk) == {
        2: KIND_NEAR}
    assert _survivors_through_the_store(store, docs, [2], 3, 2, random.Random(1)) == {
        1: KIND_NEAR, 2: KIND_NEAR}


def test_a_short_or_missing_sketch_file_names_itself(tmp_path) -> None:
    """A sketch file with fewer rows than the keys name, or none, fails the verifying task
    naming the file (phase 1 verifies its work files before a rerun reuses them)."""
    store = ReplicaSet.from_urls([str(tmp_path)])
    for p in range(2):
        work.save_array(store, work.keys_path(f"p{p}"),
                        entries([content_key("band")], [0], [KIND_NEAR]))
        work.save_array(store, work.sketches_path(f"p{p}"), np.zeros(PERMS, np.uint8))
    work.save_array(store, work.sketches_path("p1"), np.zeros(0, np.uint8))
    args = (shuffle.in_process, store, "r", ["p0", "p1"], [1, 1], 2, 60)
    with pytest.raises(ValueError, match=r"p1\.sketch\.npy: fewer sketches"):
        shuffle.run(*args, threshold=THRESHOLD, perms=PERMS)
    (tmp_path / work.sketches_path("p1")).unlink()
    with pytest.raises(OSError, match=r"p1\.sketch\.npy"):
        shuffle.run(*args, threshold=THRESHOLD, perms=PERMS)
    work.save_array(store, work.sketches_path("p1"), np.zeros(PERMS, np.uint8))
    where = shuffle.run(*args, threshold=THRESHOLD, perms=PERMS).drops
    # partition 1's row 0, a near-duplicate of partition 0's row 0 (the kept one)
    assert shuffle.pick(store, where[1]).tolist() == [(1, 0, KIND_NEAR, 0, 0)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=40), st.lists(st.integers(1, 12), max_size=6),
       st.integers(1, 7), st.integers(1, 60), st.randoms(use_true_random=False))
def test_exact_dedup_is_corpus_wide_whatever_the_partitioning_buckets_and_failures(
        tmp_path_factory, texts: list[int], cuts: list[int], buckets: int, target: int,
        rnd) -> None:
    """Exact dedup alone (the default): a text's first occurrence in the whole input
    survives, whichever partition or key group the others are in."""
    store = ReplicaSet.from_urls([str(tmp_path_factory.mktemp("exact"))])
    docs = [(t, frozenset()) for t in texts]
    got = _survivors_through_the_store(store, docs, cuts, buckets, target, rnd)
    seen: set[int] = set()
    want = {}
    for i, t in enumerate(texts):
        if t in seen:
            want[i] = KIND_EXACT
        seen.add(t)
    assert dict(sorted(got.items())) == want


def test_a_chain_collapses_to_its_first_document(tmp_path) -> None:
    """A ~ B ~ C with A and C sharing no band, in the order A, C, B: the first-occurrence rule
    dropped only B (C's only neighbour comes after it); components drop B and C."""
    docs: list[Doc] = [(0, frozenset({1})), (1, frozenset({2})), (2, frozenset({1, 2}))]
    store = ReplicaSet.from_urls([str(tmp_path)])
    got = _survivors_through_the_store(store, docs, [1, 1], 2, 3, random.Random(0))
    assert got == {1: KIND_NEAR, 2: KIND_NEAR}
    old = resolve(np.concatenate([entries([content_key(f"band {b}") for b in sorted(bands)],
                                          [i] * len(bands), [KIND_NEAR] * len(bands))
                                  for i, (_t, bands) in enumerate(docs)]))
    assert [int(p) for p in old["pos"]] == [2]
