"""What the shuffle's tests share: phase 1's key files for documents given as (text, bands),
and a mapper that runs tasks in any order, some twice."""

from __future__ import annotations

import random

import numpy as np

from pipeline.dedup import KIND_EXACT, KIND_NEAR, content_key, entries, shuffle
from pipeline.tasks import work
from storage import ReplicaSet

#: a document: its text (equal ints, equal texts) and its band values (shared: candidates)
Doc = tuple[int, frozenset[int]]


def flaky(rnd: random.Random) -> shuffle.Mapper:
    """A mapper whose tasks run in any order, some twice (a worker lost after writing)."""
    def tasks(name, fn, args):  # noqa: ANN001, ANN202
        out: list = [None] * len(args)
        order = list(range(len(args)))
        rnd.shuffle(order)
        for i in order:
            if rnd.random() < 0.3:
                fn(*args[i])  # ran, then its result was lost: the task runs again
            out[i] = fn(*args[i])
        return out
    return tasks


def write_partitions(store: ReplicaSet, docs: list[Doc], cuts: list[int],
                     sketches: np.ndarray | None = None
                     ) -> tuple[list[tuple[int, int]], list[str], list[int]]:
    """Phase 1's key files (and, with ``sketches``, a row per document, its sketch files) of
    ``docs`` cut into partitions of sizes ``cuts`` (the last takes the rest); returns each
    partition's document range, its work name and its key count."""
    bounds, at = [], 0
    for size in cuts:
        bounds.append((at, min(len(docs), at + size)))
        at = bounds[-1][1]
    bounds.append((at, len(docs)))
    names, per_part = [], []
    for p, (lo, hi) in enumerate(bounds):
        keys, pos, kinds = [], [], []
        for i in range(lo, hi):
            text, bands = docs[i]
            keys += [content_key(str(text))] + [content_key(f"band {b}") for b in sorted(bands)]
            pos += [i - lo] * (1 + len(bands))
            kinds += [KIND_EXACT] + [KIND_NEAR] * len(bands)
        names.append(f"p{p}")
        per_part.append(len(keys))
        work.save_array(store, work.keys_path(names[-1]), entries(keys, pos, kinds))
        if sketches is not None:
            work.save_array(store, work.sketches_path(names[-1]), sketches[lo:hi].ravel())
    return bounds, names, per_part
