"""The dedup shuffle through a real store: the same drops as resolving every key at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import shuffle, work
from pipeline.dedup import DROP, KIND_EXACT, KIND_NEAR, content_key, entries, merge_drops, resolve
from storage import ReplicaSet


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
