"""The partition plan: a pure function from the input files to units of work.

Uncompressed JSONL and text files are cut into byte ranges of about ``target_bytes``; readers
snap each range to record boundaries (a record belongs to the range holding its first byte),
so every record lands in exactly one partition. Parquet files are cut between row groups.
Compressed and CSV files cannot be entered in the middle: one partition each.

The plan depends only on the sorted file list and ``target_bytes`` — never on the number of
workers — so partition ``i`` and its shard always hold the same documents.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from json.encoder import encode_basestring_ascii as _jstr  # what json.dumps writes for a str
from typing import overload

import numpy as np

from pipeline.discovery import InputFile
from pipeline.filetable import FORMAT_CODES, FileTable

SPLITTABLE = ("jsonl", "txt")
#: ``partition_bytes = 0`` (auto) aims at this many partitions, within the bounds below
AUTO_PARTITIONS = 64
AUTO_MIN_BYTES = 1 << 20
AUTO_MAX_BYTES = 1 << 30
#: at most this many partitions to one task of the job's tail (see :func:`task_groups`)
TAIL_GROUP_MAX = 64
#: files counted together when a plan is made (bounds its temporaries)
_PLAN_CHUNK = 1 << 20


@dataclass(frozen=True)
class Partition:
    """One unit of work: bytes ``[start, end)`` of a file, or row groups ``[start, end)``.

    ``end == -1`` means "to the end of the file" (unsplittable inputs).
    """

    index: int
    url: str
    fmt: str
    compression: str | None
    start: int
    end: int
    version: str = ""

    @property
    def whole_file(self) -> bool:
        return self.start == 0 and self.end == -1

    def key(self, salt: str) -> str:
        """A name for this partition's work files: a hash of what it reads and how (``salt``).

        The same partition under the same configuration maps to the same key across runs, which
        is what lets a restarted driver find the work it already finished.
        """
        blob = json.dumps([asdict(self), salt], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:24]


def auto_partition_bytes(total_bytes: int) -> int:
    """The partition size for ``partition_bytes = 0``: from the input's size alone.

    Many partitions per worker keep the last round of tasks from leaving workers idle (five
    equal tasks on two workers take three rounds: 83 % busy; 64 take 32: 100 %), while at
    least 1 MiB each keeps per-task costs small. Past 64 GiB of input partitions stop growing
    at 1 GiB: a shard of a few hundred MB (many row groups), and per-partition costs (a task,
    three work files, a shard, a manifest entry) a thousandth of a 1 MiB partition's per byte.
    Worker memory no longer sets the bound: phase 1 and 2 stream a partition a row group at a
    time (``pipeline.shards.ShardWriter``), and hold the finished shard's bytes once.
    It must not depend on the number of workers: partitions are shards, and a dataset is
    the same whatever the cluster (a cluster with more threads than ``total / 1 GiB`` wants a
    smaller ``--partition-bytes``).
    """
    return min(AUTO_MAX_BYTES, max(AUTO_MIN_BYTES, math.ceil(total_bytes / AUTO_PARTITIONS)))


def task_groups(n: int, workers: int) -> list[tuple[int, int]]:
    """Consecutive ``[lo, hi)`` groups of ``n`` cheap per-partition steps, one Dask task each.

    The job's tail (linking or copying a shard that lost no row; the dedup shuffle has its own
    key groups) takes milliseconds a partition, about what a Dask task costs the driver and a
    worker: one task each doubled the tail and put three tasks per partition on the scheduler.
    About four groups per worker keep every worker busy to the end; at most
    :data:`TAIL_GROUP_MAX` partitions each bound what a retried task redoes. The grouping only
    schedules: every step's result is the same whichever group ran it.
    """
    if n <= 0:
        return []
    size = min(TAIL_GROUP_MAX, max(1, math.ceil(n / (4 * max(1, workers)))))
    return byte_ranges(n, size)


def byte_ranges(size: int, target_bytes: int) -> list[tuple[int, int]]:
    """``ceil(size / target)`` near-equal ranges covering ``[0, size)`` (one for empty files)."""
    n = max(1, math.ceil(size / max(1, target_bytes)))
    bounds = [size * i // n for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def close_at_target(sizes: Sequence[int], target: int) -> list[tuple[int, int]]:
    """Split items into consecutive ``[lo, hi)`` groups, each closed once it reaches ``target``.

    Groups hold at least the target (except the last) and at most the target plus one item.
    Used for Parquet input row groups (by bytes) and output row groups (by tokens).
    """
    out: list[tuple[int, int]] = []
    lo, acc = 0, 0
    for i, s in enumerate(sizes):
        acc += s
        if acc >= target:
            out.append((lo, i + 1))
            lo, acc = i + 1, 0
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    return out


def row_group_ranges(sizes: tuple[int, ...], target_bytes: int) -> list[tuple[int, int]]:
    """Consecutive row groups, closed as soon as their bytes reach the target."""
    return close_at_target(sizes, target_bytes) if sizes else [(0, -1)]


def plan_partitions(files: list[InputFile], target_bytes: int) -> list[Partition]:
    """Partitions in file order, then in offset order within a file."""
    if target_bytes < 1:
        raise ValueError(f"partition size must be positive, got {target_bytes} "
                         "(resolve 0 with auto_partition_bytes first)")
    parts: list[Partition] = []
    for f in files:
        if f.fmt in SPLITTABLE and f.compression is None:
            ranges = byte_ranges(f.size, target_bytes)
        elif f.fmt == "parquet":
            ranges = row_group_ranges(f.row_groups, target_bytes)
        else:
            ranges = [(0, -1)]
        for start, end in ranges:
            parts.append(Partition(len(parts), f.url, f.fmt, f.compression, start, end,
                                   f.version))
    return parts


class PartitionPlan(Sequence[Partition]):
    """:func:`plan_partitions` of a :class:`~pipeline.filetable.FileTable`, held compactly.

    Per file only a partition count (none at all when every file is one partition, as when
    files are smaller than the target); ``plan[i]`` makes partition ``i``'s
    :class:`Partition` on demand, equal to ``plan_partitions(list(table), target)[i]``, and
    :meth:`key` its work-file key without making it. The job makes Partition objects only
    for the tasks it submits.
    """

    def __init__(self, table: FileTable, target_bytes: int) -> None:
        if target_bytes < 1:
            raise ValueError(f"partition size must be positive, got {target_bytes} "
                             "(resolve 0 with auto_partition_bytes first)")
        self.table, self.target = table, target_bytes
        self._splittable = np.array([f in SPLITTABLE for f in FORMAT_CODES])
        self._parquet: dict[int, list[tuple[int, int]]] = {}
        parquet_counts: dict[int, int] = {}
        for i, groups in table.row_groups.items():
            ranges = row_group_ranges(groups, target_bytes)
            parquet_counts[i] = len(ranges)
            if len(ranges) > 1 or ranges[0] != (0, -1):
                self._parquet[i] = ranges
        #: partition i's first index per file (None: file i is partition i). Counted a
        #: chunk of files at a time: whole-table temporaries cost 80 MB each at 10 M files.
        self._first: np.ndarray | None = None
        n = len(table)
        for lo in range(0, n, _PLAN_CHUNK):
            counts = self._counts_of(lo, min(n, lo + _PLAN_CHUNK), parquet_counts)
            if self._first is None and (counts != 1).any():
                self._first = np.arange(n + 1, dtype=np.int64)  # files before lo: one each
            if self._first is not None:
                np.cumsum(counts, out=self._first[lo + 1:lo + 1 + len(counts)])
                self._first[lo + 1:lo + 1 + len(counts)] += self._first[lo]
        self._n = n if self._first is None else int(self._first[-1])

    def _counts_of(self, lo: int, hi: int, parquet_counts: dict[int, int]) -> np.ndarray:
        """Partitions of files ``[lo, hi)``: byte_ranges' ``ceil(size / target)`` for
        splittable files (the same float arithmetic; sizes < 2**53), row groups' for
        Parquet, one for the rest."""
        t = self.table
        split = self._splittable[t.formats[lo:hi]] & (t.compressions[lo:hi] == 0)
        counts = np.ones(hi - lo, dtype=np.int64)
        counts[split] = np.maximum(1, np.ceil(t.sizes[lo:hi][split] / float(self.target))
                                   ).astype(np.int64)
        for i, c in parquet_counts.items():
            if lo <= i < hi:
                counts[i - lo] = c
        return counts

    def __len__(self) -> int:
        return self._n

    def locate(self, i: int) -> tuple[int, int, int]:
        """``(file index, start, end)`` of partition ``i``."""
        if not 0 <= i < self._n:
            raise IndexError(i)
        if self._first is None:
            f, j, n = i, 0, 1
        else:
            f = int(np.searchsorted(self._first, i, side="right")) - 1
            j, n = i - int(self._first[f]), int(self._first[f + 1] - self._first[f])
        t = self.table
        if self._splittable[t.formats[f]] and t.compressions[f] == 0:
            size = int(self.table.sizes[f])
            q, r = divmod(size, n)  # size * j // n without the overflow of size * j
            return f, j * q + j * r // n, (j + 1) * q + (j + 1) * r // n
        ranges = self._parquet.get(f)
        return (f, *ranges[j]) if ranges else (f, 0, -1)

    @overload
    def __getitem__(self, i: int) -> Partition: ...
    @overload
    def __getitem__(self, i: slice) -> list[Partition]: ...
    def __getitem__(self, i: int | slice) -> Partition | list[Partition]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        f, start, end = self.locate(i)
        t = self.table
        return Partition(i, t.url(f), t.fmt(f), t.compression(f), start, end, t.version(f))

    def key(self, i: int, salt: str) -> str:
        """``self[i].key(salt)``, without making the Partition or going through ``asdict``
        and ``json.dumps`` (the same JSON text is written directly: ~4x faster)."""
        f, start, end = self.locate(i)
        t = self.table
        comp = t.compression(f)
        blob = (f'[{{"compression": {"null" if comp is None else _jstr(comp)}, "end": {end}, '
                f'"fmt": {_jstr(t.fmt(f))}, "index": {i}, "start": {start}, '
                f'"url": {_jstr(t.url(f))}, "version": {_jstr(t.version(f))}}}, {_jstr(salt)}]')
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def keys(self, salt: str) -> KeySequence:
        return KeySequence(self, salt)


class KeySequence(Sequence[str]):
    """Every partition's key in partition order, computed when asked (never all held)."""

    def __init__(self, plan: PartitionPlan, salt: str) -> None:
        self.plan, self.salt = plan, salt

    def __len__(self) -> int:
        return len(self.plan)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self.plan.key(j, self.salt) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return self.plan.key(i, self.salt)

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self.plan.key(i, self.salt)
