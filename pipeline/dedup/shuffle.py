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

With near-dup (MinHash LSH band keys), step 2 decides only exact duplicates; for band keys it
writes edges (every document sharing a key, to the smallest one sharing it) ordered by *node
bucket* (:func:`pipeline.dedup.components.bucket_of`). The connected components of those
edges are then found across buckets (:mod:`pipeline.dedup.components`): ``cc_step`` (per node
bucket, a few rounds until two steps in a row change nothing) reads its range of every
bucket's edges of the previous step, applies Large-Star or Small-Star and writes its edges
for the next step by bucket, returning a count per bucket; ``near_drops`` (per node bucket)
writes the members of each component but its smallest, by partition, for ``gather_drops``.
Each step holds one bucket's edges (at most as many as its band keys), the driver a bucket x
bucket matrix of counts.

With dedup signals (``--dedup-signals``, :mod:`pipeline.dedup.signals`) the same steps also
write *notes* on survivors: ``resolve_bucket`` one per exact key held by several documents
(how many), ``near_drops`` one per component centre with the leaves its bucket holds. They
go to the survivor's group as drops do: ``gather_drops`` sums them per document into the
group's notes file, and phase 2 picks its partition's range (:func:`pick_notes`).

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

from pipeline.dedup import DROP, ENTRY, KIND_NEAR, merge_drops, resolve
from pipeline.dedup import components as cc
from pipeline.dedup import signals as sig
from pipeline.dedup import verify as vf
from pipeline.planning.plan import close_at_target
from pipeline.tasks import work
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
    """Where one partition's drops lie: entries ``[first, end)`` of its group's drops file
    (and, with dedup signals, its notes: ``[notes_first, notes_end)`` of the notes file)."""

    run_key: str
    lo: int
    hi: int
    first: int
    end: int
    notes_first: int = 0
    notes_end: int = 0


def keys_path(run_key: str, lo: int, hi: int, buckets: int) -> str:
    """Group ``[lo, hi)``'s keys, ordered by bucket."""
    return f"{work.WORK_DIR}/p2/{run_key}/keys-{lo:07d}-{hi:07d}-by-{buckets}.bin"


def drops_path(run_key: str, bucket: int) -> str:
    return f"{work.WORK_DIR}/p2/{run_key}/drops-{bucket:05d}.bin"


def edges_path(run_key: str, step: int, bucket: int) -> str:
    """Node bucket ``bucket``'s output of components step ``step - 1`` (0: the resolve's)."""
    return f"{work.WORK_DIR}/p2/{run_key}/edges-{step:03d}-{bucket:05d}.bin"


def candidates_path(run_key: str, bucket: int) -> str:
    """Bucket ``bucket``'s LSH candidate edges, ordered by the key group of their larger end."""
    return f"{work.WORK_DIR}/p2/{run_key}/candidates-{bucket:05d}.bin"


def carried_path(run_key: str, group: int) -> str:
    """Group ``group``'s candidates with their larger end's sketch, ordered by the group of
    their smaller end."""
    return f"{work.WORK_DIR}/p2/{run_key}/carried-{group:05d}.bin"


def near_drops_path(run_key: str, bucket: int) -> str:
    return f"{work.WORK_DIR}/p2/{run_key}/near-drops-{bucket:05d}.bin"


def group_drops_path(run_key: str, lo: int, hi: int) -> str:
    return f"{work.WORK_DIR}/p2/{run_key}/drops-of-{lo:07d}-{hi:07d}.bin"


def notes_path(run_key: str, bucket: int) -> str:
    """Bucket ``bucket``'s notes on exact-key survivors (dedup signals)."""
    return f"{work.WORK_DIR}/p2/{run_key}/notes-{bucket:05d}.bin"


def near_notes_path(run_key: str, bucket: int) -> str:
    """Node bucket ``bucket``'s notes on component centres (dedup signals)."""
    return f"{work.WORK_DIR}/p2/{run_key}/near-notes-{bucket:05d}.bin"


def group_notes_path(run_key: str, lo: int, hi: int) -> str:
    return f"{work.WORK_DIR}/p2/{run_key}/notes-of-{lo:07d}-{hi:07d}.bin"


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

    # Fetched in threads, parsed here: np.load parses the .npy header with ast, and CPython
    # 3.11's AST constructor is not safe across threads ("recursion depth mismatch").
    with ThreadPoolExecutor(min(READ_THREADS, max(1, len(keys)))) as pool:
        blobs: list[bytes | None] = list(pool.map(
            lambda i: scratch.get(work.keys_path(keys[i])), range(len(keys))))
    parts = []
    for i, blob in enumerate(blobs):
        arr = work.parse_array(blob).astype(ENTRY)  # type: ignore[arg-type]
        blobs[i] = None
        arr["part"] = lo + i
        parts.append(arr)
    arr = np.concatenate(parts) if parts else np.zeros(0, dtype=ENTRY)
    del parts
    which = arr["k0"] % np.uint64(buckets)
    # stable: within a bucket, partition then position order, as written by phase 1
    scratch.put(keys_path(run_key, lo, lo + len(keys), buckets),
                arr[np.argsort(which, kind="stable")].tobytes())
    return np.bincount(which, minlength=buckets).astype(np.int64)


def resolve_bucket(store: ReplicaSet, run_key: str, bucket: int, buckets: int,
                   groups: np.ndarray, starts: np.ndarray,
                   counts: np.ndarray, verify: bool = False, signals: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Resolve one bucket: ``counts[g]`` keys from ``starts[g]`` in group ``g``'s file.

    ``groups``: ``[[lo, hi], ...]``, the key groups. Returns how many documents of each group
    this bucket condemns as exact duplicates (the drops themselves are stored, ordered by
    partition, for :func:`gather_drops`), and how many near-dup edges it wrote for each node
    bucket (:func:`cc_step`'s first input; all 0 without band keys) or, with ``verify``, how
    many candidate edges for each key group (:func:`attach_sketches`' input); then how many
    notes on exact-key survivors (``signals``; stored like the drops) fall in each group.
    """
    scratch = work.work_store(store)
    entries = _read_ranges(scratch, [(keys_path(run_key, int(lo), int(hi), buckets), int(s),
                                      int(s + n))
                                     for (lo, hi), s, n in zip(groups, starts, counts,
                                                               strict=True)], ENTRY)
    near = entries["kind"] == KIND_NEAR
    edges = np.zeros(len(groups) if verify else buckets, dtype=np.int64)
    if near.any():
        # band keys connect documents (components, below); only exact keys condemn here
        if verify:  # candidates, by the group of their larger end (sorted by node: by group)
            a, b = cc.star_edges(entries[near])
            records = np.zeros(len(a), dtype=cc.EDGE)
            records["key"], records["other"] = a, b
            records = np.unique(records)
            edges = _per_group(cc.where(records["key"])[0], groups)
            path = candidates_path(run_key, bucket)
        else:
            records, edges = cc.route(*cc.star_edges(entries[near]), 0, buckets)
            path = edges_path(run_key, 0, bucket)
        entries = entries[~near]
        if len(records):
            scratch.put(path, records.tobytes())
        del records
    notes = sig.exact_notes(entries) if signals else np.zeros(0, dtype=sig.NOTE)
    drops = resolve(entries)  # sorted by (part, pos)
    del entries
    if len(drops):
        scratch.put(drops_path(run_key, bucket), drops.tobytes())
    if len(notes):
        scratch.put(notes_path(run_key, bucket), notes.tobytes())
    return _per_group(drops["part"], groups), edges, _per_group(notes["part"], groups)


def _per_group(part: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """How many of ``part`` (partition numbers) fall in each key group."""
    return np.bincount(_group_of(part, groups), minlength=len(groups)).astype(np.int64)


def _group_of(part: np.ndarray, groups: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(groups)[:, 1], part, side="right")


def _sketches(scratch: ReplicaSet, names: list[str], lo: int, perms: int,
              nodes: np.ndarray) -> np.ndarray:
    """The sketches of documents ``nodes``, all in the key group of partitions ``lo, lo + 1,
    ...`` (``names``: their work-file names): one ``len(nodes) x perms`` matrix, read from
    phase 1's sketch files of only the partitions these documents are in."""
    part, pos = cc.where(nodes)
    need = np.unique(part)
    with ThreadPoolExecutor(min(READ_THREADS, max(1, len(need)))) as pool:
        blobs: list[bytes | None] = list(pool.map(
            lambda p: scratch.get(work.sketches_path(names[int(p) - lo])), need))
    parts = []
    for i, blob in enumerate(blobs):  # parsed here, not in the threads (see bucket_keys)
        flat = work.parse_array(blob)  # type: ignore[arg-type]
        blobs[i] = None
        if flat.dtype != np.uint8 or len(flat) % perms:
            raise ValueError(f"{work.sketches_path(names[int(need[i]) - lo])}: {len(flat)} "
                             f"{flat.dtype} values are not sketches of {perms} bytes")
        parts.append(flat.reshape(-1, perms))
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    offsets = np.zeros(len(names), dtype=np.int64)
    offsets[need - lo] = np.cumsum(sizes) - sizes
    rows = vf.rows_of(part, pos, lo, offsets)
    i = np.searchsorted(need, part)
    if len(rows) and (pos >= sizes[i]).any():
        bad = int(need[i[np.argmax(pos >= sizes[i])]]) - lo
        raise ValueError(f"{work.sketches_path(names[bad])}: fewer sketches than the "
                         "partition's keys name")
    mat = np.concatenate(parts) if parts else np.zeros((0, perms), np.uint8)
    return mat[rows]


def attach_sketches(store: ReplicaSet, run_key: str, group: int, names: list[str],
                    perms: int, groups: np.ndarray, starts: np.ndarray,
                    counts: np.ndarray) -> np.ndarray:
    """First hop of verification: key group ``group``'s candidate edges (``counts[b]`` from
    ``starts[b]`` of bucket ``b``'s candidates), each with the sketch of its larger end (a
    document of this group, ``names`` its partitions' work files), stored ordered by the group
    of the smaller end; returns how many go to each group."""
    scratch = work.work_store(store)
    cand = np.unique(_read_ranges(scratch, [(candidates_path(run_key, b), int(s), int(s + n))
                                            for b, (s, n) in enumerate(zip(starts, counts,
                                                                           strict=True))],
                                  cc.EDGE))  # a pair found in several buckets, once
    out = np.zeros(len(cand), dtype=vf.carried(perms))
    out["key"], out["other"] = cand["other"], cand["key"]
    out["sketch"] = _sketches(scratch, names, int(groups[group][0]), perms, cand["key"])
    del cand
    out = out[np.lexsort((out["other"], out["key"]))]  # by smaller end: by its group
    if len(out):
        scratch.put(carried_path(run_key, group), out.tobytes())
    return _per_group(cc.where(out["key"])[0], groups)


def check_edges(store: ReplicaSet, run_key: str, group: int, names: list[str], perms: int,
                threshold: float, groups: np.ndarray, buckets: int, starts: np.ndarray,
                counts: np.ndarray) -> np.ndarray:
    """Second hop: the candidate edges whose smaller end is in key group ``group``
    (``counts[h]`` from ``starts[h]`` of group ``h``'s :func:`attach_sketches` output) kept
    where the two sketches estimate a Jaccard >= ``threshold`` (:mod:`pipeline.dedup.verify`),
    stored as :func:`cc_step`'s first input; returns how many go to each node bucket."""
    scratch = work.work_store(store)
    got = _read_ranges(scratch, [(carried_path(run_key, h), int(s), int(s + n))
                                 for h, (s, n) in enumerate(zip(starts, counts, strict=True))],
                       vf.carried(perms))
    mine = _sketches(scratch, names, int(groups[group][0]), perms, got["key"])
    ok = vf.verified(got["sketch"], mine, threshold)
    del mine
    records, per_bucket = cc.route(got["key"][ok], got["other"][ok], 0, buckets)
    if len(records):
        scratch.put(edges_path(run_key, 0, group), records.tobytes())
    return per_bucket


def verify_candidates(tasks: Mapper, store: ReplicaSet, run_key: str, names: list[str],
                      groups: list[tuple[int, int]], buckets: int, candidates: np.ndarray,
                      perms: int, threshold: float) -> tuple[np.ndarray, int, int]:
    """Both hops of verification (``candidates``: the resolve's bucket x group counts);
    returns the group x node bucket counts of the verified edges (:func:`components`' first
    input), the ranged reads and the bytes of the count matrices the driver held."""
    n = len(groups)
    bounds = np.array(groups, dtype=np.int64).reshape(-1, 2)
    first = starts_of(candidates, axis=1)
    todo = [int(g) for g in np.flatnonzero(candidates.sum(axis=0))]
    carried = np.zeros((n, n), dtype=np.int64)
    if todo:
        carried[todo] = np.stack(tasks(
            "carry-sketches", attach_sketches,
            [(store, run_key, g, names[groups[g][0]:groups[g][1]], perms, bounds,
              first[:, g], candidates[:, g]) for g in todo]))
    first = starts_of(carried, axis=1)
    todo2 = [int(g) for g in np.flatnonzero(carried.sum(axis=0))]
    edges = np.zeros((n, buckets), dtype=np.int64)
    if todo2:
        edges[todo2] = np.stack(tasks(
            "verify-edges", check_edges,
            [(store, run_key, g, names[groups[g][0]:groups[g][1]], perms, threshold, bounds,
              buckets, first[:, g], carried[:, g]) for g in todo2]))
    reads = int(np.count_nonzero(candidates) + np.count_nonzero(carried))
    return edges, reads, candidates.nbytes + carried.nbytes + edges.nbytes


def _read_edges(scratch: ReplicaSet, run_key: str, step: int, starts: np.ndarray,
                counts: np.ndarray) -> np.ndarray:
    return _read_ranges(scratch, [(edges_path(run_key, step, int(b)), int(s), int(s + n))
                                  for b, (s, n) in enumerate(zip(starts, counts, strict=True))],
                        cc.EDGE)


def cc_step(store: ReplicaSet, run_key: str, step: int, bucket: int, buckets: int,
            starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, int]:
    """Components step ``step`` (:func:`pipeline.dedup.components.step`) on node bucket
    ``bucket``: ``counts[b]`` edges from ``starts[b]`` of bucket ``b``'s output of the previous
    step. Writes its output for step ``step + 1``; returns how many edges went to each bucket
    and how many nodes changed."""
    scratch = work.work_store(store)
    records = _read_edges(scratch, run_key, step, starts, counts)
    a, b, changed = cc.step(records, step)
    del records
    out, per_bucket = cc.route(a, b, step + 1, buckets)
    if len(out):
        scratch.put(edges_path(run_key, step + 1, bucket), out.tobytes())
    return per_bucket, changed


def near_drops(store: ReplicaSet, run_key: str, step: int, bucket: int, groups: np.ndarray,
               starts: np.ndarray, counts: np.ndarray, signals: bool = False) -> np.ndarray:
    """Node bucket ``bucket``'s near-duplicates once the components are stars (the output of
    step ``step - 1`` is its fixpoint): every member but the smallest, stored ordered by
    partition; with ``signals`` also a note per centre with how many of these are its leaves.
    Returns how many drops (row 0) and notes (row 1) of each group."""
    scratch = work.work_store(store)
    records = _read_edges(scratch, run_key, step, starts, counts)
    node, centre = cc.leaf_centres(records)
    notes = sig.cluster_notes(records) if signals else np.zeros(0, dtype=sig.NOTE)
    del records
    drops = np.zeros(len(node), dtype=DROP)
    drops["part"], drops["pos"] = cc.where(node)
    drops["keep_part"], drops["keep_pos"] = cc.where(centre)
    drops["kind"] = KIND_NEAR
    if len(drops):
        scratch.put(near_drops_path(run_key, bucket), drops.tobytes())
    if len(notes):
        scratch.put(near_notes_path(run_key, bucket), notes.tobytes())
    return np.stack([_per_group(drops["part"], groups), _per_group(notes["part"], groups)])


#: components steps before :func:`components` gives up (they take O(log² n); a few in practice)
MAX_STEPS = 200


def components(tasks: Mapper, store: ReplicaSet, run_key: str, buckets: int,
               edges: np.ndarray) -> tuple[int, np.ndarray, int]:
    """Components steps from the resolve's edges (``edges``: its bucket x node bucket counts)
    until two steps in a row change nothing; returns the step whose input is the fixpoint, its
    bucket x bucket counts, and the ranged reads of the steps."""
    per_edge, step, still, reads = edges, 0, 0, 0
    while True:
        if step >= MAX_STEPS:
            raise RuntimeError(f"near-dup components did not converge in {MAX_STEPS} steps")
        starts = starts_of(per_edge, axis=1)
        reads += int(np.count_nonzero(per_edge))
        done = tasks(f"components-{step}", cc_step,
                     [(store, run_key, step, b, buckets, starts[:, b], per_edge[:, b])
                      for b in range(buckets)])
        per_edge = np.stack([d[0] for d in done])
        step += 1
        still = still + 1 if sum(d[1] for d in done) == 0 else 0
        if still >= 2 or not per_edge.any():
            return step, per_edge, reads


def group_ranges(per_drop: np.ndarray, first: np.ndarray, group: int) -> np.ndarray:
    """``[[bucket, first, end], ...]``: where group ``group``'s drops lie in each bucket's file.

    ``per_drop``: the bucket x group matrix of counts; ``first``: ``starts_of(per_drop,
    axis=1)`` (a bucket's drops are ordered by partition, so by group).
    """
    bs = np.flatnonzero(per_drop[:, group])
    return np.stack([bs, first[bs, group], first[bs, group] + per_drop[bs, group]], axis=1)


def gather_drops(store: ReplicaSet, run_key: str, lo: int, hi: int, ranges: np.ndarray,
                 near_ranges: np.ndarray | None = None, note_ranges: np.ndarray | None = None,
                 near_note_ranges: np.ndarray | None = None) -> np.ndarray:
    """Group ``[lo, hi)``'s drops from every bucket (``ranges``: :func:`group_ranges`; with
    near-dup, ``near_ranges`` the same for :func:`near_drops`' files), one row per document
    (its strongest reason), into one file ordered by partition; returns each partition's
    count. With dedup signals (``note_ranges``, and ``near_note_ranges`` with near-dup: the
    same for the notes files) the notes too, one per document and kind (summed), into the
    group's notes file; then returns a second row, each partition's notes."""
    scratch = work.work_store(store)
    wanted = [(drops_path(run_key, int(b)), int(first), int(end)) for b, first, end in ranges]
    if near_ranges is not None:
        wanted += [(near_drops_path(run_key, int(b)), int(first), int(end))
                   for b, first, end in near_ranges]
    drops = merge_drops(_read_ranges(scratch, wanted, DROP))
    scratch.put(group_drops_path(run_key, lo, hi), drops.tobytes())
    counts = np.bincount(drops["part"] - lo, minlength=hi - lo).astype(np.int64)
    if note_ranges is None:
        return counts
    del drops
    wanted = [(notes_path(run_key, int(b)), int(first), int(end))
              for b, first, end in note_ranges]
    if near_note_ranges is not None:
        wanted += [(near_notes_path(run_key, int(b)), int(first), int(end))
                   for b, first, end in near_note_ranges]
    notes = sig.merge_notes(_read_ranges(scratch, wanted, sig.NOTE))
    scratch.put(group_notes_path(run_key, lo, hi), notes.tobytes())
    return np.stack([counts, np.bincount(notes["part"] - lo, minlength=hi - lo)
                     .astype(np.int64)])


def drop_ranges(run_key: str, lo: int, counts: np.ndarray) -> dict[int, DropRange]:
    """``{partition: DropRange}`` for the partitions of group ``[lo, lo + len(counts))`` with
    drops, from :func:`gather_drops`' counts (with notes, its two rows: the partitions with
    drops or notes)."""
    drops, notes = (counts[0], counts[1]) if counts.ndim == 2 else (counts, None)
    ends = np.cumsum(drops)
    hi = lo + len(drops)
    if notes is None:
        return {lo + int(i): DropRange(run_key, lo, hi, int(ends[i] - drops[i]), int(ends[i]))
                for i in np.flatnonzero(drops)}
    note_ends = np.cumsum(notes)
    return {lo + int(i): DropRange(run_key, lo, hi, int(ends[i] - drops[i]), int(ends[i]),
                                   int(note_ends[i] - notes[i]), int(note_ends[i]))
            for i in np.flatnonzero(drops + notes)}


def pick(store: ReplicaSet, where: DropRange) -> np.ndarray:
    """One partition's drops, sorted by position (one ranged read)."""
    return _read_ranges(work.work_store(store),
                        [(group_drops_path(where.run_key, where.lo, where.hi), where.first,
                          where.end)], DROP)


def pick_notes(store: ReplicaSet, where: DropRange) -> np.ndarray:
    """One partition's notes (dedup signals: :mod:`pipeline.dedup.signals`), sorted by
    position and kind (one ranged read; none without notes)."""
    return _read_ranges(work.work_store(store),
                        [(group_notes_path(where.run_key, where.lo, where.hi),
                          where.notes_first, where.notes_end)], sig.NOTE)


#: runs one step's tasks: ``(step name, fn, [args, ...]) -> [fn(*args), ...]`` in order; the
#: job's runs them on Dask, tests and benchmarks in the calling process
Mapper = Callable[[str, Callable[..., Any], list[tuple[Any, ...]]], list[Any]]


@dataclass(frozen=True)
class Shuffled:
    """What :func:`run` found, and what it cost the store and the driver."""

    #: ``{partition: where its drops lie}``, for partitions with any (with ``signals``, or
    #: with notes)
    drops: dict[int, DropRange]
    buckets: int
    groups: int
    #: ranged reads of the resolve and gather steps (one per nonempty group x bucket range)
    ranged_reads: int
    #: the count matrices the driver held (group x bucket, bucket x group; with near-dup
    #: also bucket x bucket ones)
    driver_bytes: int
    #: near-dup components steps run (0 without band keys)
    components_steps: int = 0


def run(tasks: Mapper, store: ReplicaSet, run_key: str, keys: list[str],
        keys_per_partition: Sequence[int], buckets: int = 0, per_task: int = 0,
        threshold: float = 0.0, perms: int = 0, signals: bool = False) -> Shuffled:
    """The whole shuffle: where the drops of each partition with any lie.

    ``keys``: the partitions' work-file names, in partition order; ``keys_per_partition``:
    how many dedup keys each has (phase 1's rows x keys per document); ``buckets`` and
    ``per_task`` (a key group's size): 0 for :func:`sizes`' choice. Between steps only counts
    come back: a group x bucket matrix of keys, a bucket x group one of drops, and a count per
    partition. The drops are the same whatever the buckets and groups.

    ``threshold`` > 0: near-dup candidate edges join the components only when the sketches
    of ``perms`` bytes phase 1 left (:func:`pipeline.tasks.work.sketches_path`) estimate a Jaccard
    >= ``threshold`` (:func:`verify_candidates`); 0: every edge joins.

    ``signals``: the survivors' notes too (:mod:`pipeline.dedup.signals`), whose ranges the
    :class:`DropRange` of each partition with drops or notes names (:func:`pick_notes`).
    """
    auto_per_task, auto_buckets = sizes(sum(keys_per_partition))
    buckets, per_task = buckets or auto_buckets, per_task or auto_per_task
    groups = key_groups(keys_per_partition, per_task)
    per_key = np.stack(tasks("bucket-keys", bucket_keys,
                             [(store, run_key, keys[lo:hi], lo, buckets) for lo, hi in groups]))
    bounds = np.array(groups, dtype=np.int64).reshape(-1, 2)
    starts = starts_of(per_key, axis=1)
    verify = threshold > 0
    resolved = tasks("bucket", resolve_bucket,
                     [(store, run_key, b, buckets, bounds, starts[:, b], per_key[:, b], verify,
                       signals) for b in range(buckets)])
    per_drop = np.stack([r[0] for r in resolved])
    edges = np.stack([r[1] for r in resolved])
    per_note = np.stack([r[2] for r in resolved])
    del resolved
    first, first_note = starts_of(per_drop, axis=1), starts_of(per_note, axis=1)
    per_near, first_near = np.zeros_like(per_drop), np.zeros_like(per_drop)
    per_near_note, first_near_note = np.zeros_like(per_drop), np.zeros_like(per_drop)
    steps = cc_reads = verify_bytes = 0
    if verify and edges.any():  # candidates -> edges whose sketches agree
        edges, cc_reads, verify_bytes = verify_candidates(tasks, store, run_key, keys, groups,
                                                          buckets, edges, perms, threshold)
    if edges.any():  # near-dup: components of the band-key graph, across buckets
        steps, per_edge, reads = components(tasks, store, run_key, buckets, edges)
        cc_reads += reads + int(np.count_nonzero(per_edge))
        starts_e = starts_of(per_edge, axis=1)
        near = np.stack(tasks("near-drops", near_drops,
                              [(store, run_key, steps, b, bounds, starts_e[:, b],
                                per_edge[:, b], signals) for b in range(buckets)]))
        per_near, per_near_note = near[:, 0], near[:, 1]
        del near
        first_near = starts_of(per_near, axis=1)
        first_near_note = starts_of(per_near_note, axis=1)
        cc_reads += int(np.count_nonzero(per_near) + np.count_nonzero(per_near_note))
    with_drops = [int(g) for g in np.flatnonzero(per_drop.sum(axis=0) + per_near.sum(axis=0)
                                                 + per_note.sum(axis=0)
                                                 + per_near_note.sum(axis=0))]

    def gather_args(g: int) -> tuple[Any, ...]:
        near_ranges = group_ranges(per_near, first_near, g) if steps else None
        if not signals:
            return (store, run_key, *groups[g], group_ranges(per_drop, first, g)) + (
                (near_ranges,) if steps else ())
        return (store, run_key, *groups[g], group_ranges(per_drop, first, g), near_ranges,
                group_ranges(per_note, first_note, g),
                group_ranges(per_near_note, first_near_note, g) if steps else None)

    counts = tasks("drops-of", gather_drops, [gather_args(g) for g in with_drops])
    out: dict[int, DropRange] = {}
    for g, c in zip(with_drops, counts, strict=True):
        out.update(drop_ranges(run_key, groups[g][0], c))
    return Shuffled(out, buckets, len(groups),
                    int(np.count_nonzero(per_key) + np.count_nonzero(per_drop)
                        + np.count_nonzero(per_note)) + cc_reads,
                    per_key.nbytes + per_drop.nbytes + 2 * per_near.nbytes
                    + (edges.nbytes if steps else 0) + verify_bytes
                    + (per_note.nbytes + 2 * per_near_note.nbytes if signals else 0), steps)


def in_process(name: str, fn: Callable[..., Any], args: list[tuple[Any, ...]]) -> list[Any]:
    """A :data:`Mapper` that runs each task here, one after another."""
    return [fn(*a) for a in args]


def starts_of(counts: np.ndarray, axis: int) -> np.ndarray:
    """Where each run of ``counts`` starts when they are laid out one after another."""
    return np.cumsum(counts, axis=axis) - counts
