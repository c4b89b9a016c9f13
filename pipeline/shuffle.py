"""The dedup shuffle, through the store: no task holds more than one partition's or one bucket's
keys, and Dask holds nothing between tasks but counts.

Phase 1 leaves each partition's dedup keys under ``_work/``. Then:

1. ``bucket_keys`` (per partition, several to a task) rewrites them ordered by bucket
   (``k0 % buckets``) and returns how many fall in each bucket; the driver turns the counts
   into entry ranges.
2. ``resolve_bucket`` (per bucket) reads its range of every partition's file, decides the
   duplicates (:func:`pipeline.dedup.resolve`), writes them ordered by partition, and returns
   how many each partition has.
3. ``pick`` (per partition with duplicates) reads its range of every bucket's drops, for phase 2.

Keeping the keys as Dask results instead would hold the keys of the whole input in the
cluster's memory until the last bucket is resolved (25 bytes per document and per MinHash band).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pipeline import work
from pipeline.dedup import DROP, ENTRY, resolve
from storage import ReplicaSet

#: concurrent ranged reads per task (each is one small GET on an object store)
READ_THREADS = 16


def keys_by_bucket_path(key: str, buckets: int) -> str:
    return f"{work.WORK_DIR}/p1/{key}.keys-by-{buckets}.bin"


def drops_path(run_key: str, bucket: int) -> str:
    return f"{work.WORK_DIR}/p2/{run_key}/drops-{bucket:05d}.bin"


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


def bucket_keys(store: ReplicaSet, key: str, index: int, buckets: int) -> np.ndarray:
    """Partition ``index``'s keys ordered by bucket; returns the count in each bucket."""
    scratch = work.work_store(store)
    arr = work.load_array(scratch, work.keys_path(key)).astype(ENTRY)
    arr["part"] = index
    which = arr["k0"] % np.uint64(buckets)
    scratch.put(keys_by_bucket_path(key, buckets),
                arr[np.argsort(which, kind="stable")].tobytes())
    return np.bincount(which, minlength=buckets).astype(np.int64)


def bucket_keys_of(store: ReplicaSet, keys: list[str], indices: list[int],
                   buckets: int) -> np.ndarray:
    """:func:`bucket_keys` for several partitions, one after another, in one task: a
    ``[partition, bucket]`` count matrix (see :func:`pipeline.plan.task_groups`)."""
    return np.stack([bucket_keys(store, k, i, buckets)
                     for k, i in zip(keys, indices, strict=True)])


def resolve_bucket(store: ReplicaSet, run_key: str, bucket: int, buckets: int,
                   keys: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Resolve one bucket: ``counts[i]`` keys from ``starts[i]`` in partition ``i``'s file.

    ``keys`` are the partition keys (file names). Returns how many documents of each partition
    this bucket condemns; the drops themselves are stored, ordered by partition, for
    :func:`pick`.
    """
    scratch = work.work_store(store)
    entries = _read_ranges(scratch, [(keys_by_bucket_path(str(k), buckets), int(lo), int(lo + n))
                                     for k, lo, n in zip(keys, starts, counts, strict=True)],
                           ENTRY)
    drops = resolve(entries)  # sorted by (part, pos)
    del entries
    if len(drops):
        scratch.put(drops_path(run_key, bucket), drops.tobytes())
    return np.bincount(drops["part"], minlength=len(keys)).astype(np.int64)


def pick(store: ReplicaSet, run_key: str, ranges: np.ndarray) -> np.ndarray:
    """One partition's drops, from ``[[bucket, first, end], ...]`` of the buckets' drops."""
    return _read_ranges(work.work_store(store),
                        [(drops_path(run_key, int(b)), int(lo), int(hi)) for b, lo, hi in ranges],
                        DROP)


def starts_of(counts: np.ndarray, axis: int) -> np.ndarray:
    """Where each run of ``counts`` starts when they are laid out one after another."""
    return np.cumsum(counts, axis=axis) - counts
