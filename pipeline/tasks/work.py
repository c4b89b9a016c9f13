"""Work files under ``_work/`` in the output: what makes a killed driver's rerun cheap.

Phase 1 of a partition (parse → clean → tokenize) leaves its tokenized rows, its dedup keys
and, written last, a ``done`` marker, all named by the partition's key (a hash of what it
reads and of the configuration). Phase 2 (drop duplicates → final shard) leaves a marker named
by the run key (a hash of every partition key), because which rows it drops depends on the
whole input. A rerun of the same command finds the markers and redoes only what is missing.
Work files live on the primary replica only and are deleted once the manifest is committed;
readers never see them (the manifest is the index), and ``python -m storage gc`` leaves them
alone while any is younger than its grace period (a run in progress).
"""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from pipeline.output.shard_table import ShardTable
from pipeline.steps.contract import REPORT_EXAMPLES
from storage import WORK_DIR, ObjectInfo, ReplicaSet, ShardInfo, digest_bytes
from storage.io.listing import list_tree
from storage.io.retry import PERMANENT, classify


@dataclass(slots=True)
class PhaseOne:
    """What phase 1 of one partition found: counts, and where its work files are.

    Slotted: a rerun's driver makes one per finished partition (:func:`counts_only`), ~10 M
    of them for a corpus of small files, before folding it (:class:`PhaseOneState`)."""

    index: int
    key: str
    docs_in: int = 0
    rows: int = 0
    tokens: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    changed: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    quarantine: ObjectInfo | None = None
    #: the rows in ``_work/`` as a finished shard (``None``: no rows)
    shard: ShardInfo | None = None
    #: the keys file's SHA-256 (checked before reuse when the work files were not synced)
    keys_sha256: str = ""
    #: near-dup only: the MinHash sketches file's SHA-256 (``""``: none written)
    sketches_sha256: str = ""
    #: False: the work files were written without fsync (a local store; see
    #: :func:`work_store`) and must be verified before a rerun reuses them
    durable: bool = True
    resumed: bool = False
    #: ``--strict`` only: the first bad record, which stops the run (nothing was written)
    error: str | None = None
    #: the steps' signal columns in its shard: name -> Parquet type (``{}``: none)
    signals: dict[str, str] = field(default_factory=dict)
    #: the steps' reports (step name -> report: :mod:`pipeline.steps.contract`; ``{}``: none,
    #: and then absent from its marker)
    reports: dict[str, Any] = field(default_factory=dict)
    #: the lineage's record of the documents its steps dropped (:mod:`pipeline.lineage.records`;
    #: ``None``: none dropped, and then absent from its marker)
    drops: ObjectInfo | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PhaseOne:
        q, s, r = d.get("quarantine"), d.get("shard"), d.get("drops")
        return cls(**{**d, "quarantine": ObjectInfo(**q) if q else None,
                      "shard": ShardInfo.from_dict(s) if s else None, "resumed": True,
                      "drops": ObjectInfo(**r) if r else None})


@dataclass
class PhaseTwo:
    index: int
    shard: ShardInfo | None
    duplicates: dict[str, int] = field(default_factory=dict)
    resumed: bool = False
    #: the columns phase 2 added to the shard (dedup signals): name -> Parquet type
    signals: dict[str, str] = field(default_factory=dict)
    #: the lineage's record of its duplicates (``None``: none, absent from its marker)
    drops: ObjectInfo | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PhaseTwo:
        s, r = d.get("shard"), d.get("drops")
        return cls(d["index"], ShardInfo.from_dict(s) if s else None, d.get("duplicates", {}),
                   resumed=True, signals=d.get("signals") or {},
                   drops=ObjectInfo(**r) if r else None)


class PhaseOneResults:
    """Phase 1's results as the driver keeps them: nothing per partition as a Python object.

    A :class:`PhaseOne` a partition held until the end (a few hundred bytes each with its
    dicts and shard record: GBs at 10 M partitions) is folded in as it arrives: its row count
    into one array (the dedup shuffle sizes its buckets and groups from it; 4 bytes a
    partition, 8 past 4 Gi rows), the rest summed; only partitions with quarantined records
    keep their quarantine object. Phase 2 reads a partition's full result from its marker on
    the store (:func:`load_one`), on the worker that needs it.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.rows = np.zeros(n, dtype=np.uint32)
        self.docs_in = self.tokens = self.resumed = self.count = 0
        self.dropped: Counter[str] = Counter()
        self.changed: Counter[str] = Counter()
        self.quarantined: Counter[str] = Counter()
        #: partition index -> its quarantine object (only partitions that have one)
        self.quarantine: dict[int, ObjectInfo] = {}
        #: partition index -> its lineage record of step drops (only those with one)
        self.drops: dict[int, ObjectInfo] = {}
        #: every shard's signal columns and their types
        self.signals: dict[str, str] = {}
        #: the steps' reports, bounded as they arrive (:class:`StepReports`)
        self.reports = StepReports()

    def add(self, one: PhaseOne) -> None:
        if one.rows >= 2**32 and self.rows.dtype != np.int64:
            self.rows = self.rows.astype(np.int64)
        self.rows[one.index] = one.rows
        self.docs_in += one.docs_in
        self.tokens += one.tokens
        self.resumed += one.resumed
        self.count += 1
        self.dropped.update(one.dropped)
        self.changed.update(one.changed)
        self.quarantined.update(one.quarantined)
        if one.quarantine:
            self.quarantine[one.index] = one.quarantine
        if one.drops:
            self.drops[one.index] = one.drops
        merge_signals(self.signals, one.signals, one.index)
        if one.reports:
            self.reports.add(one.index, one.reports)

    def quarantines(self) -> tuple[ObjectInfo, ...]:
        """The quarantine objects in partition order."""
        return tuple(self.quarantine[i] for i in sorted(self.quarantine))

    def total(self) -> PhaseOne:
        """Everything summed as one result (its quarantine: the first partition's)."""
        q = self.quarantines()
        return PhaseOne(-1, "", docs_in=self.docs_in, rows=int(self.rows.sum()),
                        tokens=self.tokens, dropped=dict(self.dropped),
                        changed=dict(self.changed), quarantined=dict(self.quarantined),
                        quarantine=q[0] if q else None, signals=dict(self.signals))


def merge_signals(into: dict[str, str], more: dict[str, str], index: int) -> None:
    """Fold one shard's signal columns into the dataset's: a column two shards give two
    types is an error naming it (a step that writes a value of another type elsewhere)."""
    for name, kind in more.items():
        known = into.setdefault(name, kind)
        if known != kind:
            if {known, kind} == {"int64", "double"}:
                into[name] = "double"  # an int column in one shard, floats in another
                continue
            raise ValueError(f"signal {name!r} (step {name.partition('.')[0]!r}) is {kind} "
                             f"in partition {index}'s shard and {known} in another's")


class StepReports:
    """The partitions' step reports merged in partition order, whatever order they arrive
    in, holding at most :data:`REPORT_EXAMPLES` examples per step and key: the documents are
    summed at once, and a partition's examples are kept only while they are among the first
    ones by partition index (the report of a run is the same on every rerun)."""

    def __init__(self) -> None:
        #: (step, key) -> documents
        self.documents: Counter[tuple[str, str]] = Counter()
        #: (step, key) -> [(partition index, its examples)], sorted, trimmed
        self.parts: dict[tuple[str, str], list[tuple[int, list[Any]]]] = {}

    def add(self, index: int, reports: dict[str, Any]) -> None:
        for step, report in reports.items():
            for key, part in report.items():
                self.documents[(step, key)] += int(part.get("documents", 0))
                examples = list(part.get("examples", []))
                if not examples:
                    continue
                held = self.parts.setdefault((step, key), [])
                held.append((index, examples))
                held.sort(key=lambda pair: pair[0])
                total = 0
                for at, (_, kept) in enumerate(held):  # drop the parts past the first 100
                    total += len(kept)
                    if total >= REPORT_EXAMPLES:
                        del held[at + 1:]
                        break

    def merged(self) -> dict[str, dict[str, Any]]:
        """step -> key -> ``{"documents", "examples"}`` (the first examples by partition)."""
        out: dict[str, dict[str, Any]] = {}
        for (step, key), documents in sorted(self.documents.items()):
            examples = [e for _, kept in self.parts.get((step, key), []) for e in kept]
            out.setdefault(step, {})[key] = {"documents": documents,
                                             "examples": examples[:REPORT_EXAMPLES]}
        return out


class PhaseOneState:
    """An earlier run's phase-1 markers as a rerun's driver keeps them: by partition index, in
    arrays, only what :class:`PhaseOneResults` folds and whether the work files were synced.

    Filled as the ledgers stream (:func:`stream_state`), a later marker for a partition
    replacing an earlier one, as the dict of every marker did. That dict held ~3 KB a
    partition plus ~700 bytes for each row group of its rows file, and a ``PhaseOne`` of the
    counts alone ~0.7 KB with its path: ~7 GB at 10 M partitions of small files. Here: 25 bytes
    a partition and 4 per partition for each drop, change or quarantine reason any marker
    names (a handful), plus the quarantine objects of the partitions that have one.
    """

    NONE, SYNCED, UNSYNCED = 0, 1, 2
    _COUNTED = ("dropped", "changed", "quarantined")

    def __init__(self, n: int) -> None:
        self.n = n
        self.kind = np.zeros(n, dtype=np.uint8)
        self.rows = np.zeros(n, dtype=np.int64)
        self.docs_in = np.zeros(n, dtype=np.int64)
        self.tokens = np.zeros(n, dtype=np.int64)
        #: (field, reason) -> count per partition (a reason's column is made when first seen)
        self.counts: dict[tuple[str, str], np.ndarray] = {}
        self.quarantine: dict[int, ObjectInfo] = {}
        self.drops: dict[int, ObjectInfo] = {}
        #: the signal columns of every marker read (not per partition: a handful)
        self.signals: dict[str, str] = {}
        #: the steps' reports of the partitions that have one (decontamination hits)
        self.reports: dict[int, dict[str, Any]] = {}

    def put(self, index: int, one: PhaseOne | None) -> None:
        """Partition ``index``'s marker (``None``: present but not reusable: redo it)."""
        for column in self.counts.values():
            column[index] = 0
        self.quarantine.pop(index, None)
        self.drops.pop(index, None)
        self.reports.pop(index, None)
        if one is None:
            self.kind[index] = self.NONE
            self.rows[index] = self.docs_in[index] = self.tokens[index] = 0
            return
        self.kind[index] = self.SYNCED if one.durable else self.UNSYNCED
        self.rows[index], self.docs_in[index], self.tokens[index] = (
            one.rows, one.docs_in, one.tokens)
        for name in self._COUNTED:
            for reason, count in getattr(one, name).items():
                column = self.counts.get((name, reason))
                if column is None:
                    column = self.counts[(name, reason)] = np.zeros(self.n, dtype=np.uint32)
                if count >= 1 << 32 and column.dtype != np.int64:
                    column = self.counts[(name, reason)] = column.astype(np.int64)
                column[index] = count
        if one.quarantine is not None:
            self.quarantine[index] = one.quarantine
        if one.drops is not None:
            self.drops[index] = one.drops
        if one.reports:
            self.reports[index] = one.reports
        merge_signals(self.signals, one.signals, index)

    def get(self, index: int) -> PhaseOne | None:
        """Partition ``index``'s counts as a :class:`PhaseOne` (``None``: nothing reusable)."""
        kind = int(self.kind[index])
        if kind == self.NONE:
            return None
        per: dict[str, dict[str, int]] = {name: {} for name in self._COUNTED}
        for (name, reason), column in self.counts.items():
            if column[index]:
                per[name][reason] = int(column[index])
        return PhaseOne(index, "", docs_in=int(self.docs_in[index]),
                        rows=int(self.rows[index]), tokens=int(self.tokens[index]),
                        quarantine=self.quarantine.get(index), durable=kind == self.SYNCED,
                        resumed=True, signals=dict(self.signals),
                        reports=self.reports.get(index, {}), drops=self.drops.get(index),
                        **per)


class PhaseTwoResults:
    """Phase 2's results as the driver keeps them: which partitions are done, their
    duplicate counts summed, and their shards folded into a :class:`ShardTable` (compact
    records, not ``ShardInfo`` objects: ~52 bytes per row group, not ~510)."""

    def __init__(self) -> None:
        self.done: set[int] = set()
        self.shards = ShardTable()
        self._duplicates: dict[int, dict[str, int]] = {}  # only partitions that dropped any
        #: partition index -> its lineage record of duplicates (only those with one)
        self.drops: dict[int, ObjectInfo] = {}
        #: the columns phase 2 added to any shard (dedup signals) and their types
        self.signals: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.done)

    def __contains__(self, index: object) -> bool:
        return index in self.done

    def add(self, two: PhaseTwo) -> None:
        """Partition ``two.index``'s result (a later one for the same partition replaces it)."""
        self.done.add(two.index)
        self._duplicates.pop(two.index, None)
        self.drops.pop(two.index, None)
        if two.drops is not None:
            self.drops[two.index] = two.drops
        if two.duplicates:
            self._duplicates[two.index] = dict(two.duplicates)
        if two.shard is not None:
            self.shards.add(two.index, two.shard)
        else:
            self.shards.discard(two.index)
        merge_signals(self.signals, two.signals, two.index)

    def discard(self, index: int) -> None:
        """Forget partition ``index``'s result (a newer marker for it is not usable)."""
        self.done.discard(index)
        self._duplicates.pop(index, None)
        self.drops.pop(index, None)
        self.shards.discard(index)

    @property
    def duplicates(self) -> Counter[str]:
        """Duplicates dropped in phase 2, summed over the partitions."""
        out: Counter[str] = Counter()
        for index in sorted(self._duplicates):
            out.update(self._duplicates[index])
        return out


def load_one(store: ReplicaSet, key: str) -> PhaseOne:
    """Partition ``key``'s phase-1 result from its marker (every finished phase 1 leaves
    one: :func:`done1_path`); a missing marker is an error naming it (the task is retried)."""
    d = get_json(work_store(store), done1_path(key))
    if not d:
        raise FileNotFoundError(f"{done1_path(key)}: phase-1 marker missing or unreadable")
    return PhaseOne.from_dict(d)


def rows_path(key: str) -> str:
    return f"{WORK_DIR}/p1/{key}.rows.parquet"


def keys_path(key: str) -> str:
    return f"{WORK_DIR}/p1/{key}.keys.npy"


def sketches_path(key: str) -> str:
    """Near-dup: each row's MinHash sketch (``perms`` bytes a row, one flat uint8 array)."""
    return f"{WORK_DIR}/p1/{key}.sketch.npy"


#: phase-1 markers in a folder of their own: listing it returns one name per finished
#: partition (plus the ledgers), not the three of ``p1/`` (rows, keys, marker)
DONE1_DIR = f"{WORK_DIR}/done1"


def done1_path(key: str) -> str:
    return f"{DONE1_DIR}/{key}.done.json"


def done2_dir(run_key: str) -> str:
    return f"{WORK_DIR}/p2/{run_key}"


def done2_path(run_key: str, index: int) -> str:
    return f"{WORK_DIR}/p2/{run_key}/part-{index:05d}.done.json"


def run_key(partition_keys: Iterable[str]) -> str:
    """A hash of every partition key in order (``"\n".join``'s bytes, fed a key at a time)."""
    h = hashlib.sha256()
    for n, k in enumerate(partition_keys):
        h.update((f"\n{k}" if n else k).encode())
    return h.hexdigest()[:24]


def work_store(store: ReplicaSet) -> ReplicaSet:
    """The primary replica alone: work files are scratch, not worth a quorum write.

    Nor an fsync: three per partition (rows, keys, marker) stalled phase 1's tokenizing on
    the disk. A local file reaches the disk with the kernel's writeback instead; what must be
    durable is synced where it becomes part of the dataset (phase 2 puts the shard through the
    synced store before its marker), and a rerun after a power loss verifies the work files
    against the checksums in their marker before reusing them (:func:`intact`).
    """
    return ReplicaSet([store.replicas[0].loc], sync=False)


def intact(store: ReplicaSet, one: PhaseOne) -> bool:
    """Whether ``one``'s work files are all there with the bytes its marker names.

    A marker that outlived a power loss may describe files the disk never got (they were not
    synced, and the marker was written after them but not necessarily stored after them).
    """
    try:
        if one.shard is not None:
            store.get(rows_path(one.key), sha256=one.shard.sha256)
        if one.sketches_sha256 and (digest_bytes(store.get(sketches_path(one.key)))
                                    != one.sketches_sha256):
            return False
        return digest_bytes(store.get(keys_path(one.key))) == one.keys_sha256
    except OSError:  # missing, torn (checksum), unreadable: the work is redone
        return False


def put_json(store: ReplicaSet, relative: str, obj: Any) -> None:
    store.put(relative, json.dumps(obj, sort_keys=True).encode())


def get_json(store: ReplicaSet, relative: str) -> dict[str, Any] | None:
    """A marker, or ``None`` when absent or unreadable (then the work is simply redone)."""
    try:
        return json.loads(store.get(relative))
    except (FileNotFoundError, ValueError):
        return None
    except OSError:
        return None


def markers(store: ReplicaSet, paths: list[str]) -> list[dict[str, Any] | None]:
    """The markers at ``paths`` (``None`` where absent), reading only those that exist.

    Their folders are listed once first: a fresh run of 3 M partitions would otherwise send
    6 M GETs for markers that are not there (hours at ~10 ms each through 8 threads) before
    its first task; listing takes one call per 1,000 names on S3. Where the store refuses to
    list (no permission, no LIST call), every marker is read; a listing that times out or
    fails transiently is raised: the store would not answer the reads either.
    """
    folders = {p.rpartition("/")[0] for p in paths}
    loc = store.replicas[0].loc
    present: set[str] = set()
    try:
        for folder in folders:
            present.update(list_tree(loc, folder))
    except OSError as exc:
        if classify(exc) != PERMANENT:
            raise
        present = set(paths)
    todo = [p for p in paths if p in present]
    with ThreadPoolExecutor(8) as pool:
        found = dict(zip(todo, pool.map(lambda p: get_json(store, p), todo), strict=True))
    return [found.get(p) for p in paths]


#: a ledger holds the markers of this many finished tasks (or of :data:`LEDGER_S` seconds')
LEDGER_BATCH = 1024
LEDGER_S = 30.0
#: ... or of this many row groups: a phase-2 marker lists its shard's row groups (~230 bytes
#: of JSON each, ~1,000 for a 1 GiB partition), so 1,024 of them made a ~230 MB ledger that
#: the driver held as ~700 MB of dicts until written, and a rerun parsed whole
LEDGER_ROW_GROUPS = 32_768
LEDGER_PREFIX = "ledger-"
#: ledgers read ahead of the one being folded (a rerun holds at most this many parsed)
STATE_READ_AHEAD = 8

Marker = dict[str, Any]


def read_state(store: ReplicaSet, folder: str) -> dict[str, Marker] | None:
    """Every marker under ``folder``: ``{marker path: marker}`` (the newest ledger's copy where
    several hold one), or ``None`` when the store refuses to list. For inspection and tests:
    a driver folds :func:`stream_state` instead, holding no marker."""
    stream = stream_state(store, folder)
    return None if stream is None else dict(stream)


def stream_state(store: ReplicaSet, folder: str, ahead: int = STATE_READ_AHEAD
                 ) -> Iterator[tuple[str, Marker]] | None:
    """The markers under ``folder`` as ``(path, marker)`` pairs, each ledger's in turn (oldest
    first: a later pair for a path replaces an earlier), then the loose markers no ledger
    holds; ``None`` when the store refuses to list.

    One listing of the folder (markers have folders of their own: one name per finished
    task), then the ledgers (each holds up to :data:`LEDGER_BATCH` markers or
    :data:`LEDGER_ROW_GROUPS` row groups, written by the driver as tasks finish:
    :class:`Compactor`) and only the loose markers no ledger holds (tasks that finished after
    the last ledger): ``done / LEDGER_BATCH`` reads plus at most a batch and a window's,
    instead of one read per finished task. At most ``ahead`` ledgers are read ahead of the
    caller: a rerun of a 100 TB run (~100 M row groups in its phase-2 markers, ~70 GB as
    dicts) folds them a ledger at a time instead of holding them all.
    """
    loc = store.replicas[0].loc
    try:
        names = sorted(list_tree(loc, folder))
    except OSError as exc:
        if classify(exc) != PERMANENT:
            raise
        return None
    return _stream(store, names, max(1, ahead))


def _stream(store: ReplicaSet, names: list[str], ahead: int
            ) -> Iterator[tuple[str, Marker]]:
    ledgers = [n for n in names if n.rpartition("/")[2].startswith(LEDGER_PREFIX)]
    in_ledgers: set[str] = set()
    with ThreadPoolExecutor(ahead) as pool:
        for got in _read_ahead(pool, lambda n: get_json(store, n), ledgers, ahead):
            # A ledger is a copy: one that is not a dict of markers (torn, damaged) is skipped,
            # and the loose markers it held are read instead.
            for path, d in got.items() if isinstance(got, dict) else ():
                in_ledgers.add(path)
                yield path, d
        loose = [n for n in names if n.endswith(".done.json") and n not in in_ledgers]
        del in_ledgers
        for n, d in zip(loose, _read_ahead(pool, lambda n: get_json(store, n), loose,
                                           ahead * 8), strict=True):
            if d is not None:
                yield n, d


def _read_ahead(pool: ThreadPoolExecutor, read: Callable[[str], Any], names: list[str],
                ahead: int) -> Iterator[Any]:
    """``map(read, names)`` on ``pool``, in order, with at most ``ahead`` reads not yet taken
    (``Executor.map`` submits them all at once and keeps every result until it is taken)."""
    pending: deque[Future[Any]] = deque()
    names_left = iter(names)
    try:
        for name in islice(names_left, ahead):
            pending.append(pool.submit(read, name))
        while pending:
            got = pending.popleft().result()
            for name in islice(names_left, 1):
                pending.append(pool.submit(read, name))
            yield got
    finally:
        for fut in pending:
            fut.cancel()


def reusable_marker(d: Any) -> bool:
    """Whether ``d`` can be an earlier phase 1's marker of this version: a dict, with a shard
    entry for its rows (a marker with rows but none is an older version's: redo it)."""
    return isinstance(d, dict) and bool(d.get("shard") or not d.get("rows"))


def load_reusable(store: ReplicaSet, key: str) -> PhaseOne | None:
    """Partition ``key``'s whole phase-1 marker where :func:`reusable_marker` (``None``: gone,
    an older version's, or fields this version cannot read: redo it)."""
    d = get_json(work_store(store), done1_path(key))
    if not reusable_marker(d):
        return None
    try:
        return PhaseOne.from_dict(d)  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError):
        return None


def counts_only(d: Marker) -> PhaseOne:
    """A phase-1 marker as a rerun's driver keeps it: what :class:`PhaseOneResults` folds and
    whether its work files were synced, none of its names, checksums or row groups (folded
    into :class:`PhaseOneState`). A partition whose unsynced work files must be verified has
    its whole marker read again by its task (:func:`load_reusable`)."""
    return PhaseOne.from_dict({**d, "key": "", "shard": None, "keys_sha256": "",
                               "sketches_sha256": ""})


class Compactor:
    """The driver's ledger of finished tasks: every :data:`LEDGER_BATCH` markers,
    :data:`LEDGER_ROW_GROUPS` row groups in them (or :data:`LEDGER_S` seconds) one
    ``ledger-*.json`` in the markers' folder holding them, so a rerun reads a ledger per
    batch (:func:`stream_state`), not a marker per task. The loose markers stay (the tasks write
    them; a driver killed before its next ledger loses nothing): the ledger is a copy, read
    first."""

    def __init__(self, store: ReplicaSet, folder: str, batch: int = LEDGER_BATCH,
                 every_s: float = LEDGER_S, row_groups: int = LEDGER_ROW_GROUPS) -> None:
        self.store, self.folder, self.batch, self.every_s = store, folder, batch, every_s
        self.row_groups = row_groups
        self.pending: dict[str, dict[str, Any]] = {}
        self.pending_groups = 0
        self.written = 0
        self._since = time.monotonic()

    def add(self, path: str, obj: PhaseOne | PhaseTwo) -> None:
        self.pending[path] = marker(obj)
        self.pending_groups += len(obj.shard.row_groups) if obj.shard is not None else 0
        if (len(self.pending) >= self.batch or self.pending_groups >= self.row_groups
                or time.monotonic() - self._since >= self.every_s):
            self.flush()

    def flush(self) -> None:
        """Write the pending markers as one ledger (best effort: a ledger that could not be
        written leaves their loose markers to be read one by one)."""
        self._since = time.monotonic()
        if not self.pending:
            return
        name = f"{self.folder}/{LEDGER_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        try:
            put_json(self.store, name, self.pending)
            self.written += 1
        except OSError:
            pass
        self.pending = {}
        self.pending_groups = 0


def marker(obj: PhaseOne | PhaseTwo) -> dict[str, Any]:
    d = asdict(obj)
    d.pop("resumed")
    if not d.get("reports", True):  # a marker keeps its bytes unless a step reported
        d.pop("reports")
    if d.get("drops", 0) is None:  # ... or the lineage recorded drops
        d.pop("drops")
    return d


def save_array(store: ReplicaSet, relative: str, arr: np.ndarray) -> str:
    """Write ``arr`` as ``.npy``; returns the file's SHA-256."""
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    data = buf.getvalue()
    store.put(relative, data)
    return digest_bytes(data)


def npy_header(dtype: np.dtype, n: int) -> bytes:
    """The ``.npy`` header :func:`numpy.save` writes for a 1-D array of ``n`` ``dtype``."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(dtype),
                                               "fortran_order": False, "shape": (n,)})
    return buf.getvalue()


class ArraySpool:
    """A 1-D array appended in pieces to a temporary file and saved as one ``.npy``: the bytes
    :func:`save_array` writes for all pieces concatenated, without holding them all.

    The pieces start :data:`HEADER_ROOM` bytes into the file; the header, known once the
    length is, goes right before them, so the file is read back once, as the object's bytes.
    """

    HEADER_ROOM = 4096

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype, self.n = np.dtype(dtype), 0
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by save/close
        self._file.seek(self.HEADER_ROOM)

    def append(self, arr: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(arr, dtype=self.dtype).tobytes())
        self.n += len(arr)

    def save(self, store: ReplicaSet, relative: str) -> str:
        """Put the ``.npy`` at ``relative``; returns the file's SHA-256. Closes the spool."""
        header = npy_header(self.dtype, self.n)
        start = self.HEADER_ROOM - len(header)
        with self._file:
            self._file.seek(start)
            self._file.write(header)
            self._file.seek(start)
            data = self._file.read()
        store.put(relative, data)
        return digest_bytes(data)

    def close(self) -> None:
        self._file.close()


def parse_array(data: bytes) -> np.ndarray:
    """An array from ``.npy`` bytes (never pickles). Not from several threads at once: the
    header is parsed with ``ast``, which CPython 3.11 does not make thread-safe."""
    return np.load(io.BytesIO(data), allow_pickle=False)



def remove_work(store: ReplicaSet) -> None:
    """Delete ``_work/`` everywhere it may be (best effort: leftovers are harmless)."""
    for replica in store.replicas:
        try:
            path = replica.loc.path(WORK_DIR)
            if replica.loc.fs.exists(path):
                replica.loc.fs.rm(path, recursive=True)
        except Exception:  # noqa: S110 - a failed cleanup must not fail a committed run
            pass
