"""The partition plan: a pure function from the input files to units of work.

Uncompressed JSONL and text files are cut into byte ranges of about ``target_bytes``; readers
snap each range to record boundaries (a record belongs to the range holding its first byte),
so every record lands in exactly one partition. Parquet files are cut between row groups.
Compressed and CSV files cannot be entered in the middle: one partition each. Consecutive small
files (each one partition, under ``target_bytes``) are packed into one partition, up to
``max_files`` of them (``--files-per-partition``).

The plan depends only on the sorted file list, ``target_bytes`` and ``max_files`` — never on
the number of workers — so partition ``i`` and its shard always hold the same documents.
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

from pipeline.planning.filetable import FORMAT_CODES, FileTable, Growable, InputFile

SPLITTABLE = ("jsonl", "txt")
#: ``partition_bytes = 0`` (auto) aims at this many partitions, within the bounds below
AUTO_PARTITIONS = 64
AUTO_MIN_BYTES = 1 << 20
AUTO_MAX_BYTES = 1 << 30
#: at most this many partitions to one task of the job's tail (see :func:`task_groups`)
TAIL_GROUP_MAX = 64
#: at most this many files to a packed partition (``--files-per-partition``; see
#: :func:`plan_partitions`): a Partition names its files, so this bounds a task's size
PACK_MAX_FILES = 1024
#: files counted together when a plan is made (bounds its temporaries: ~10 arrays of this)
_PLAN_CHUNK = 1 << 14


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
    #: the further files of a packed partition, read after the first, each whole:
    #: ``(url, fmt, compression, start, end, version)`` (see :func:`plan_partitions`)
    members: tuple[tuple[str, str, str | None, int, int, str], ...] = ()

    @property
    def whole_file(self) -> bool:
        return self.start == 0 and self.end == -1

    def pieces(self) -> list[Partition]:
        """The single-file partitions this one reads, in order (itself when not packed)."""
        if not self.members:
            return [self]
        first = Partition(self.index, self.url, self.fmt, self.compression, self.start,
                          self.end, self.version)
        return [first] + [Partition(self.index, *m) for m in self.members]

    def key(self, salt: str) -> str:
        """A name for this partition's work files: a hash of what it reads and how (``salt``).

        The same partition under the same configuration maps to the same key across runs, which
        is what lets a restarted driver find the work it already finished. A partition of one
        file hashes as it did before packing existed (no ``members`` entry).
        """
        fields = asdict(self)
        if not self.members:
            del fields["members"]
        blob = json.dumps([fields, salt], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:24]


def auto_partition_bytes(total_bytes: int) -> int:
    """The partition size for ``partition_bytes = 0``: from the input's size alone.

    Many partitions per worker keep the last round of tasks from leaving workers idle (five
    equal tasks on two workers take three rounds: 83 % busy; 64 take 32: 100 %), while at
    least 1 MiB each keeps per-task costs small. Past 64 GiB of input partitions stop growing
    at 1 GiB: a shard of a few hundred MB (many row groups), and per-partition costs (a task,
    three work files, a shard, a manifest entry) a thousandth of a 1 MiB partition's per byte.
    Worker memory no longer sets the bound: phase 1 and 2 stream a partition a row group at a
    time (``pipeline.output.shards.ShardWriter``), and hold the finished shard's bytes once.
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


def _packable(size: int, n_ranges: int, target_bytes: int, max_files: int) -> bool:
    return max_files > 1 and n_ranges == 1 and size < target_bytes


def plan_partitions(files: list[InputFile], target_bytes: int,
                    max_files: int = PACK_MAX_FILES) -> list[Partition]:
    """Partitions in file order, then in offset order within a file.

    Small files are packed: in a run of consecutive files that are each one partition and
    smaller than the target, each weighs its size but at least ``ceil(target / max_files)``,
    and the run is cut where the weight before a file crosses a multiple of the target. So a
    packed partition holds < 2 x the target in bytes and at most ``max_files`` files
    (1: no packing), and the cut is one running sum (vectorised by :class:`PartitionPlan`).
    Ten million files of 10 MB are ~100 k partitions of ~1 GiB, not ten million tasks and
    shards. The cut depends only on the sorted sizes, so it is the same on every run. This
    loop is the reference :class:`PartitionPlan` is tested against.
    """
    if target_bytes < 1:
        raise ValueError(f"partition size must be positive, got {target_bytes} "
                         "(resolve 0 with auto_partition_bytes first)")
    if max_files < 1:
        raise ValueError(f"files per partition must be >= 1, got {max_files}")
    parts: list[Partition] = []
    pending: list[tuple[str, str, str | None, int, int, str]] = []
    pack: int | None = None
    run_weight = 0
    least = -(-target_bytes // max_files)

    def close() -> None:
        if pending:
            first, rest = pending[0], tuple(pending[1:])
            parts.append(Partition(len(parts), *first, members=rest))
            pending.clear()

    for f in files:
        if f.fmt in SPLITTABLE and f.compression is None:
            ranges = byte_ranges(f.size, target_bytes)
        elif f.fmt == "parquet":
            ranges = row_group_ranges(f.row_groups, target_bytes)
        else:
            ranges = [(0, -1)]
        if _packable(f.size, len(ranges), target_bytes, max_files):
            here = run_weight // target_bytes
            if here != pack:
                close()
            pack = here
            pending.append((f.url, f.fmt, f.compression, *ranges[0], f.version))
            run_weight += max(f.size, least)
            continue
        close()
        pack, run_weight = None, 0
        for start, end in ranges:
            parts.append(Partition(len(parts), f.url, f.fmt, f.compression, start, end,
                                   f.version))
    close()
    return parts


def _json_codec(compression: str | None) -> str:
    return "null" if compression is None else _jstr(compression)


@dataclass
class _Run:
    """Where a run of packable files stands at the end of one chunk of the table."""

    open: bool = False
    weight: int = 0
    pack: int = -1


class PartitionPlan(Sequence[Partition]):
    """:func:`plan_partitions` of a :class:`~pipeline.planning.filetable.FileTable`, held compactly.

    Per run of partitions only where it starts in files and partitions (nothing at all when
    every file is one partition); ``plan[i]`` makes partition ``i``'s :class:`Partition` on
    demand, equal to ``plan_partitions(list(table), target, max_files)[i]``, and
    :meth:`key` its work-file key without making it. The job makes Partition objects only for
    the tasks it submits.
    """

    def __init__(self, table: FileTable, target_bytes: int,
                 max_files: int = PACK_MAX_FILES) -> None:
        if target_bytes < 1:
            raise ValueError(f"partition size must be positive, got {target_bytes} "
                             "(resolve 0 with auto_partition_bytes first)")
        if max_files < 1:
            raise ValueError(f"files per partition must be >= 1, got {max_files}")
        self.table, self.target, self.max_files = table, target_bytes, max_files
        self._splittable = np.array([f in SPLITTABLE for f in FORMAT_CODES])
        self._parquet: dict[int, list[tuple[int, int]]] = {}
        counted: dict[int, int] = {}
        for i, groups in table.row_groups.items():
            ranges = row_group_ranges(groups, target_bytes)
            counted[i] = len(ranges)
            if len(ranges) > 1 or ranges[0] != (0, -1):
                self._parquet[i] = ranges
        # Parquet files' partition counts by file index, sorted: a chunk takes its slice
        at = np.array(sorted(counted), dtype=np.int64)
        parquet_counts = (at, np.array([counted[int(i)] for i in at], dtype=np.int64))
        del counted
        #: the plan as segments: segment k is partitions [parts[k], parts[k+1]) of files
        #: [files[k], files[k+1]); one of them spans one partition (a file, or a pack of
        #: files) or one file (cut in several). Last entries: the totals. None: file i is
        #: partition i. Counted a chunk of files at a time: whole-table temporaries cost
        #: 80 MB each at 10 M files; O(segments) whatever a file is cut into.
        seg_files: Growable | None = None
        seg_parts: Growable | None = None
        n, total = len(table), 0
        run = _Run()
        for lo in range(0, n, _PLAN_CHUNK):
            hi = min(n, lo + _PLAN_CHUNK)
            made = self._partitions_of(lo, hi, parquet_counts, run)
            if seg_files is None and (made != 1).any():
                seg_files, seg_parts = Growable(np.int64, lo + 1024), Growable(np.int64, lo + 1024)
                seg_files.extend(np.arange(lo, dtype=np.int64))  # files before lo: one each
                seg_parts.extend(np.arange(lo, dtype=np.int64))
            if seg_files is not None and seg_parts is not None:
                opens = np.flatnonzero(made)
                seg_files.extend(opens + lo)
                seg_parts.extend((np.cumsum(made) - made)[opens] + total)
            total += int(made.sum())
        if seg_files is not None and seg_parts is not None:
            seg_files.extend([n])
            seg_parts.extend([total])
            self._seg_files, self._seg_parts = seg_files.finish(), seg_parts.finish()
        else:
            self._seg_files = self._seg_parts = None
        self._n = total

    def _partitions_of(self, lo: int, hi: int, parquet_counts: tuple[np.ndarray, np.ndarray],
                       run: _Run) -> np.ndarray:
        """How many partitions start at each file of ``[lo, hi)``: ``ceil(size / target)``
        for splittable files (byte_ranges' float arithmetic; sizes < 2**53), row groups'
        for Parquet, one for the rest; a packed file 1 if it opens its pack, else 0.
        ``run`` carries a run of packable files across chunks (and is updated)."""
        t = self.table
        sizes = np.asarray(t.sizes[lo:hi], dtype=np.int64)
        split = self._splittable[t.formats[lo:hi]] & (t.compressions[lo:hi] == 0)
        counts = np.ones(hi - lo, dtype=np.int64)
        counts[split] = np.maximum(1, np.ceil(sizes[split] / float(self.target))
                                   ).astype(np.int64)
        at, parquet = parquet_counts
        first, last = np.searchsorted(at, [lo, hi])
        counts[at[first:last] - lo] = parquet[first:last]
        if self.max_files <= 1:
            return counts
        q = (counts == 1) & (sizes < self.target)
        if not q.any():
            run.open = False
            return counts
        m = hi - lo
        before_q = np.empty(m, dtype=bool)
        before_q[0], before_q[1:] = run.open, q[:-1]
        opens = q & ~before_q
        # each file's run start in this chunk (-1: its run began in an earlier chunk)
        start = np.where(opens, np.arange(m, dtype=np.int64), -1)
        np.maximum.accumulate(start, out=start)
        carried = start < 0
        weight = np.where(q, np.maximum(sizes, -(-self.target // self.max_files)), 0)
        ahead = np.cumsum(weight) - weight  # weight of small files before each, in this chunk
        before = np.where(carried, ahead + run.weight, ahead - ahead[np.maximum(start, 0)])
        pack = before // self.target
        prev = np.empty(m, dtype=np.int64)
        prev[0], prev[1:] = run.pack, pack[:-1]
        made = np.where(q, (opens | (pack != prev)).astype(np.int64), counts)
        run.open = bool(q[-1])
        if run.open:
            run.weight, run.pack = int(before[-1] + weight[-1]), int(pack[-1])
        return made

    def __len__(self) -> int:
        return self._n

    def _segment(self, i: int) -> tuple[int, int, int, int]:
        """``(first file, end file, i's place in its segment, the segment's partitions)``."""
        if not 0 <= i < self._n:
            raise IndexError(i)
        if self._seg_files is None or self._seg_parts is None:
            return i, i + 1, 0, 1
        k = int(np.searchsorted(self._seg_parts, i, side="right")) - 1
        first = int(self._seg_parts[k])
        return (int(self._seg_files[k]), int(self._seg_files[k + 1]), i - first,
                int(self._seg_parts[k + 1]) - first)

    def span(self, i: int) -> tuple[int, int]:
        """Files ``[lo, hi)`` that partition ``i`` reads (more than one: a packed partition)."""
        lo, hi, _, _ = self._segment(i)
        return lo, hi

    def locate(self, i: int) -> tuple[int, int, int]:
        """``(file index, start, end)`` of partition ``i`` (its first file, when packed)."""
        f, _, j, n = self._segment(i)
        return self._range(f, j, n)

    def _range(self, f: int, j: int, n: int) -> tuple[int, int, int]:
        """Piece ``j`` of the ``n`` that file ``f`` is cut into."""
        t = self.table
        if self._splittable[t.formats[f]] and t.compressions[f] == 0:
            size = int(t.sizes[f])
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
        lo, hi = self.span(i)
        f, start, end = self.locate(i)
        t = self.table
        members = tuple((t.url(g), t.fmt(g), t.compression(g), *self._range(g, 0, 1)[1:],
                         t.version(g)) for g in range(lo + 1, hi))
        return Partition(i, t.url(f), t.fmt(f), t.compression(f), start, end, t.version(f),
                         members)

    def key(self, i: int, salt: str) -> str:
        """``self[i].key(salt)`` without making the Partition or going through ``asdict`` and
        ``json.dumps`` (the same JSON text is written directly: ~4x faster; a rerun's planning
        hashes every partition's files)."""
        lo, hi, j, n = self._segment(i)
        f, start, end = self._range(lo, j, n)
        t = self.table
        members = ""
        if hi - lo > 1:
            members = '"members": [' + ", ".join(
                f"[{_jstr(t.url(g))}, {_jstr(t.fmt(g))}, {_json_codec(t.compression(g))}, "
                f"{s}, {e}, {_jstr(t.version(g))}]"
                for g, s, e in (self._range(g, 0, 1) for g in range(lo + 1, hi))) + "], "
        blob = (f'[{{"compression": {_json_codec(t.compression(f))}, "end": {end}, '
                f'"fmt": {_jstr(t.fmt(f))}, "index": {i}, {members}"start": {start}, '
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
