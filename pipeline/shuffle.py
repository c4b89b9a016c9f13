"""The dedup shuffle, through the store: no task holds more than one group's or one bucket's
keys, and Dask holds nothing between tasks but counts.

Phase 1 leaves each partition's dedup keys under ``_work/``. Consecutive partitions then form
*key groups* of about as many keys as a bucket (:func:`sizes`, :func:`key_groups`, from phase 1's
row counts):

1. ``bucket_keys`` (per group) writes the group's keys into one file ordered by bucket
   (``k0 % buckets``) and returns how many fall in each bucket: the driver has a
   group x bucket matrix of counts and turns it into entry ranges.
2. ``resolve_bucket`` (per bucket) reads its range of every group's file, decides the
   duplicates (:func:`pipeline.dedup.resolve`), writes them ordered by (partition, position)
   and returns how many fall in each group: a bucket x group matrix.
3. ``gather_drops`` (per group with drops) reads its range of every bucket's drops, keeps one
   row per document (the strongest reason), writes them in one file ordered by partition and
   returns each partition's count: the driver has a :class:`DropRange` per partition.
4. ``pick`` (in phase 2, per partition with drops) reads its range of that file.

Why groups, not partitions: one file per partition makes every bucket read one range per
partition and the driver hold partition x bucket matrices. At 3 M partitions (50 TB of text
in 16 MiB partitions) and 512 buckets that is 1.5 G ranged reads per step and two 12 GB
matrices; with groups of ~85 partitions, 18 M reads and two 143 MB matrices, plus one count
per partition. Keeping the keys as Dask results instead would hold the keys of the whole
input in the cluster's memory until the last bucket is resolved (25 bytes per document and
per MinHash band).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline import work
from pipeline.dedup import DROP, ENTRY, merge_drops, resolve
from pipeline.plan import close_at_target
from storage import ReplicaSet

#: concurrent ranged reads per task (each is one small GET on an object store)
READ_THREADS = 16
#: keys per shuffle task (one bucket's, or one key group's): ~100 bytes each, ~50 MiB
TASK_KEYS = 1 << 19
#: at most this many buckets and about as many key groups: a bucket reads one range per group,
#: and the driver holds two group x bucket count matrices (<= 134 MB each at 4096 x 4096)
MAX_TASKS = 4096


def sizes(total_keys: int) -> tuple[int, int]:
    """``(keys per task, buckets)`` for a shuffle of ``total_keys`` keys.

    Up to ``MAX_TASKS x TASK_KEYS`` keys (2 Gi: ~4 TB of 2 KB documents, exact dedup) a task
    holds ``TASK_KEYS``; beyond, tasks grow rather than their number, so that the reads of a
    step (buckets x groups) stay under 17 M and the driver's matrices under 134 MB each: at
    26 G keys (50 TB of text) a task holds ~6.3 M keys, ~630 MB.
    """
    per_task = max(TASK_KEYS, -(-total_keys // MAX_TASKS))
    return per_task, max(1, -(-total_keys // per_task))


@dataclass(frozen=True)
class DropRange:
    """Where one partition's drops lie: entries ``[first, end)`` of its group's drops file."""

    run_key: str
    lo: int
    hi: int
    first: int
    end: int


def keys_path(run_key: str, lo: int, hi: int, buckets: int) -> str:
    """Group ``[lo, hi)``'s keys, ordered by bucket."""
    return f"{work.WORK_DIR}/p2/{run_key}/keys-{lo:07d}-{hi:07d}-by-{buckets}.bin"


def drops_path(run_key: str, bucket: int) -> str:
    return f"{work.WORK_DIR}/p2/{run_key}/drops-{bucket:05d}.bin"


def group_drops_path(run_key: str, lo: int, hi: int) -> str:
    return f"{work.WORK_DIR}/p2/{run_key}/drops-of-{lo:07d}-{hi:07d}.bin"


def key_groups(keys_per_partition: Sequence[int],
               target: int = TASK_KEYS) -> list[tuple[int, int]]:
    """Consecutive partitions ``[lo, hi)``, each group closed once it holds ``target`` keys.

    A group holds at most ``target`` keys plus one partition's. From counts alone, so the
    groups (and the files named after them) are the same whatever the cluster.
    """
    return close_at_target(keys_per_partition, max(1, target)) if keys_per_partition else []


def _read_ranges(store: ReplicaSet, ranges: list[tuple[str, int, int]],
                 dtype: np.dtype) -> np.ndarray:
    """Entries ``[lo, hi)`` of raw record files, concatenated into one preallocated array."""
    ranges = [r for r in ranges if r[2] > r[1]]
    out = np.empty(sum(hi - lo for _, lo, hi in ranges), dtype=dtype)
    starts = np.cumsum([0] + [hi - lo for _, lo, hi in ranges])

    def read(i: int) -> None:
        path, lo, hi = ranges[i]
        data = store.get(path, start=lo * dtype.itemsize, end=hi * dtype.itemsize)
        out[starts[i]:starts[i + 1]] = np.frombuffer(data, dtype=dtype)

    with ThreadPoolExecutor(min(READ_THREADS, max(1, len(ranges)))) as pool:
        list(pool.map(read, range(len(ranges))))
    return out


def bucket_keys(store: ReplicaSet, run_key: str, keys: list[str], lo: int,
                buckets: int) -> np.ndarray:
    """Partitions ``lo, lo + 1, ...``'s keys (``keys``: their work-file names) in one file
    ordered by bucket; returns the count in each bucket."""
    scratch = work.work_store(store)

    def load(i: int) -> np.ndarray:
        arr = work.load_array(scratch, work.keys_path(keys[i])).astype(ENTRY)
        arr["part"] = lo + i
        return arr

    with ThreadPoolExecutor(min(READ_THREADS, max(1, len(keys)))) as pool:
        parts = list(pool.map(load, range(len(keys))))
    arr = np.concatenate(parts) if parts else np.zeros(0, dtype=ENTRY)
    del parts
    which = arr["k0"] % np.uint64(buckets)
    # stable: within a bucket, partition then position order, as written by phase 1
    scratch.put(keys_path(run_key, lo, lo + len(keys), buckets),
                arr[np.argsort(which, kind="stable")].tobytes())
    return np.bincount(which, minlength=buckets).astype(np.int64)


def resolve_bucket(store: ReplicaSet, run_key: str, bucket: int, buckets: int,
                   groups: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Resolve one bucket: ``counts[g]`` keys from ``starts[g]`` in group ``g``'s file.

    ``groups``: ``[[lo, hi], ...]``, the key groups. Returns how many documents of each group
    this bucket condemns; the drops themselves are stored, ordered by partition, for
    :func:`gather_drops`.
    """
    scratch = work.work_store(store)
    entries = _read_ranges(scratch, [(keys_path(run_key, int(lo), int(hi), buckets), int(s),
                                      int(s + n))
                                     for (lo, hi), s, n in zip(groups, starts, counts,
                                                               strict=True)], ENTRY)
    drops = resolve(entries)  # sorted by (part, pos)
    del entries
    if len(drops):
        scratch.put(drops_path(run_key, bucket), drops.tobytes())
    group = np.searchsorted(np.asarray(groups)[:, 1], drops["part"], side="right")
    return np.bincount(group, minlength=len(groups)).astype(np.int64)


def group_ranges(per_drop: np.ndarray, first: np.ndarray, group: int) -> np.ndarray:
    """``[[bucket, first, end], ...]``: where group ``group``'s drops lie in each bucket's file.

    ``per_drop``: the bucket x group matrix of counts; ``first``: ``starts_of(per_drop,
    axis=1)`` (a bucket's drops are ordered by partition, so by group).
    """
    bs = np.flatnonzero(per_drop[:, group])
    return np.stack([bs, first[bs, group], first[bs, group] + per_drop[bs, group]], axis=1)


def gather_drops(store: ReplicaSet, run_key: str, lo: int, hi: int,
                 ranges: np.ndarray) -> np.ndarray:
    """Group ``[lo, hi)``'s drops from every bucket (``ranges``: :func:`group_ranges`), one row
    per document, into one file ordered by partition; returns each partition's count."""
    scratch = work.work_store(store)
    drops = merge_drops(_read_ranges(scratch, [(drops_path(run_key, int(b)), int(first),
                                                int(end)) for b, first, end in ranges], DROP))
    scratch.put(group_drops_path(run_key, lo, hi), drops.tobytes())
    return np.bincount(drops["part"] - lo, minlength=hi - lo).astype(np.int64)


def drop_ranges(run_key: str, lo: int, counts: np.ndarray) -> dict[int, DropRange]:
    """``{partition: DropRange}`` for the partitions of group ``[lo, lo + len(counts))`` with
    drops, from :func:`gather_drops`' counts."""
    ends = np.cumsum(counts)
    hi = lo + len(counts)
    return {lo + int(i): DropRange(run_key, lo, hi, int(ends[i] - counts[i]), int(ends[i]))
            for i in np.flatnonzero(counts)}


def pick(store: ReplicaSet, where: DropRange) -> np.ndarray:
    """One partition's drops, sorted by position (one ranged read)."""
    return _read_ranges(work.work_store(store),
                        [(group_drops_path(where.run_key, where.lo, where.hi), where.first,
                          where.end)], DROP)


#: runs one step's tasks: ``(step name, fn, [args, ...]) -> [fn(*args), ...]`` in order; the
#: job's runs them on Dask, tests and benchmarks in the calling process
Mapper = Callable[[str, Callable[..., Any], list[tuple[Any, ...]]], list[Any]]


@dataclass(frozen=True)
class Shuffled:
    """What :func:`run` found, and what it cost the store and the driver."""

    #: ``{partition: where its drops lie}``, for partitions with any
    drops: dict[int, DropRange]
    buckets: int
    groups: int
    #: ranged reads of the resolve and gather steps (one per nonempty group x bucket range)
    ranged_reads: int
    #: the count matrices the driver held (group x bucket, bucket x group)
    driver_bytes: int


def run(tasks: Mapper, store: ReplicaSet, run_key: str, keys: list[str],
        keys_per_partition: Sequence[int], buckets: int = 0, per_task: int = 0) -> Shuffled:
    """The whole shuffle: where the drops of each partition with any lie.

    ``keys``: the partitions' work-file names, in partition order; ``keys_per_partition``:
    how many dedup keys each has (phase 1's rows x keys per document); ``buckets`` and
    ``per_task`` (a key group's size): 0 for :func:`sizes`' choice. Between steps only counts
    come back: a group x bucket matrix of keys, a bucket x group one of drops, and a count per
    partition. The drops are the same whatever the buckets and groups.
    """
    auto_per_task, auto_buckets = sizes(sum(keys_per_partition))
    buckets, per_task = buckets or auto_buckets, per_task or auto_per_task
    groups = key_groups(keys_per_partition, per_task)
    per_key = np.stack(tasks("bucket-keys", bucket_keys,
                             [(store, run_key, keys[lo:hi], lo, buckets) for lo, hi in groups]))
    bounds = np.array(groups, dtype=np.int64).reshape(-1, 2)
    starts = starts_of(per_key, axis=1)
    per_drop = np.stack(tasks("bucket", resolve_bucket,
                              [(store, run_key, b, buckets, bounds, starts[:, b], per_key[:, b])
                               for b in range(buckets)]))
    first = starts_of(per_drop, axis=1)
    with_drops = [int(g) for g in np.flatnonzero(per_drop.sum(axis=0))]
    counts = tasks("drops-of", gather_drops,
                   [(store, run_key, *groups[g], group_ranges(per_drop, first, g))
                    for g in with_drops])
    out: dict[int, DropRange] = {}
    for g, c in zip(with_drops, counts, strict=True):
        out.update(drop_ranges(run_key, groups[g][0], c))
    return Shuffled(out, buckets, len(groups),
                    int(np.count_nonzero(per_key) + np.count_nonzero(per_drop)),
                    per_key.nbytes + per_drop.nbytes)


def in_process(name: str, fn: Callable[..., Any], args: list[tuple[Any, ...]]) -> list[Any]:
    """A :data:`Mapper` that runs each task here, one after another."""
    return [fn(*a) for a in args]


def starts_of(counts: np.ndarray, axis: int) -> np.ndarray:
    """Where each run of ``counts`` starts when they are laid out one after another."""
    return np.cumsum(counts, axis=axis) - counts
