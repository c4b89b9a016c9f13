"""The dedup shuffle through a real store: the same drops as resolving every key at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import shuffle, work
from pipeline.dedup import KIND_EXACT, content_key, drops_for, entries, resolve
from pipeline.plan import task_groups
from storage import ReplicaSet


def _run(store: ReplicaSet, docs: list[list[int]], buckets: int,
         workers: int = 1) -> list[np.ndarray]:
    """bucket_keys → resolve_bucket → pick, the way the driver chains them (the keys counted
    a group of partitions to a task, as for ``workers``)."""
    keys = [f"k{i}" for i in range(len(docs))]
    for key, vals in zip(keys, docs, strict=True):
        work.save_array(store, work.keys_path(key),
                        entries([content_key(str(v)) for v in vals], list(range(len(vals))),
                                [KIND_EXACT] * len(vals)))
    per_key = np.concatenate([shuffle.bucket_keys_of(store, keys[lo:hi], list(range(lo, hi)),
                                                     buckets)
                              for lo, hi in task_groups(len(keys), workers)])
    starts = shuffle.starts_of(per_key, axis=1)
    per_drop = np.stack([shuffle.resolve_bucket(store, "run", b, buckets, np.array(keys),
                                                starts[:, b], per_key[:, b])
                         for b in range(buckets)])
    first = shuffle.starts_of(per_drop, axis=1)
    out = []
    for i in range(len(docs)):
        bs = np.flatnonzero(per_drop[:, i])
        ranges = np.stack([bs, first[bs, i], first[bs, i] + per_drop[bs, i]], axis=1)
        out.append(shuffle.pick(store, "run", ranges))
    return out


@settings(max_examples=40)
@given(st.lists(st.lists(st.integers(0, 12), max_size=20), min_size=1, max_size=6),
       st.integers(1, 9), st.integers(1, 3))
def test_shuffle_through_the_store_finds_the_same_drops(tmp_path_factory, docs: list[list[int]],
                                                        buckets: int, workers: int) -> None:
    root: Path = tmp_path_factory.mktemp("shuffle")
    store = ReplicaSet.from_urls([str(root)])
    picked = _run(store, docs, buckets, workers)
    everything = resolve(np.concatenate([
        entries([content_key(str(v)) for v in vals], list(range(len(vals))),
                [KIND_EXACT] * len(vals), part) for part, vals in enumerate(docs)]))
    for i, got in enumerate(picked):
        assert (got["part"] == i).all()
        want = everything[everything["part"] == i]
        assert drops_for([got], i).tolist() == want.tolist()
