"""The pipeline job: plan partitions, run the two phases and the dedup shuffle on Dask, commit.

Order of events, each safe to interrupt: the output's writer lease is taken on every replica
(``storage.io.replicas.leases``; the primary must answer; renewed meanwhile, checked again
right before the swap: one run writes an output at a time, since runs would share ``_work/``,
and no gc of one replica runs under it); the tokenizer is written; phase 1 and
phase 2 leave markers under ``_work/`` (see ``pipeline.tasks.work``); the manifest is built last, in
partition order, from results that do not depend on timing; the binary row-group index of its
shards is put (``index/<sha16>.sfidx``, the store's quorum put) and named by the manifest
(``shardflow.dataset/2``), which is committed by one atomic put of
``manifest.json`` (``storage.admin.versions.commit``, which then records the version under
``_versions/``); then ``_work/`` is removed and the lease released. Every object outside
``_work/`` has a content-addressed name, so a rebuild into the output of a committed dataset
never touches what that dataset's manifest names: until the swap readers see the old version,
complete, and a reader that opened it finishes on it; a killed rebuild leaves it as it was. A
rerun after a crash redoes only what has no marker, and produces the same bytes.

Memory: a worker runs one task at a time and holds at most ``B0 + C + shard bytes`` in phase
1 or 2 (B0 the idle worker, ~250 MiB with GPT-2; C ~64 MiB for the read block, one encode batch
and one row group: a partition is streamed a row group at a time, ``shards.ShardWriter``; the
finished shard's compressed bytes, ~0.4 x partition_bytes, once for the put), or B0 plus
one dedup bucket or key group (~100 bytes x ``shuffle.TASK_KEYS`` keys; more beyond 2 Gi keys,
see ``shuffle.sizes``) during the shuffle, whatever the input size. Only counts and small
results reach the driver. Details and exceptions: docs/pipeline-job.md, "Worker memory"; checked by
tests/pipeline/test_memory.py.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TextIO, TypeVar

import numpy as np
from distributed import Client, Future

from pipeline.config import PipelineConfig
from pipeline.dedup import shuffle
from pipeline.dedup import signals as dedup_signals
from pipeline.driver import carbon
from pipeline.driver.cluster import dask_client
from pipeline.driver.progress import ProgressBar
from pipeline.driver.window import TaskWindow
from pipeline.driver.worker_checks import check_not_all_unreadable, probe_inputs, watch
from pipeline.lineage import provenance
from pipeline.lineage.code_version import code_version
from pipeline.output import cluster
from pipeline.output.contamination import build_report, with_report
from pipeline.output.shard_table import ShardTable
from pipeline.output.shards import schema_description
from pipeline.planning.discovery import default_corpus, discover_table
from pipeline.planning.filetable import FORMAT_CODES, FileTable
from pipeline.planning.plan import PartitionPlan, auto_partition_bytes, task_groups
from pipeline.records import StrictModeError
from pipeline.steps.checks import check_on_workers
from pipeline.steps.columns import META_COLUMNS
from pipeline.tasks import tokenizing, work
from pipeline.tasks.record_steps import RecordLimits
from pipeline.tasks.stages import (
    HiddenOptions,
    StageParams,
    needs_sketches,
    phase_one,
    phase_one_again,
    phase_two,
    phase_two_each,
    sample_texts,
)
from storage import (
    Manifest,
    ReplicaSet,
    TokenizerInfo,
    commit,
    display_url,
    shard_name,
    tokenizer_name,
    tokens,
)
from storage.format.index import indexed
from storage.format.layout import drops_list_name
from storage.io.degraded import describe as describe_degraded
from storage.io.index_store import write_object_list
from storage.io.replicas.leases import ReplicaLeases, hold_replicas


@dataclass
class RunSummary:
    output: str
    partitions: int
    shards: int
    docs_in: int
    docs_out: int
    dropped: dict[str, int]
    quarantined: dict[str, int]
    tokens: int
    bytes: int
    wall_s: float
    dashboard: str | None = None
    resumed: int = 0
    #: the version record this run added (``""``: the manifest was the latest version's)
    version: str = ""
    #: degraded writes still open after the commit (``storage.io.degraded``): one line each
    degraded: tuple[str, ...] = ()
    inputs: int = 0
    #: inputs of 0 bytes (a truncated upload, an empty .jsonl.gz): listed, never silent
    empty_inputs: tuple[str, ...] = ()
    extra: dict[str, float] = field(default_factory=dict)
    #: ``stats.energy``'s record (pipeline.driver.carbon.RunEnergy.record)
    energy: dict[str, Any] = field(default_factory=dict)
    #: documents the decontaminate steps found per ``<step>.<set>`` (``{}``: no such step)
    contamination: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def render(self) -> str:
        def reasons(d: dict[str, int]) -> str:
            return ", ".join(f"{k}={v:,}" for k, v in sorted(d.items())) or "none"
        empty = (f" ({len(self.empty_inputs):,} empty: {', '.join(self.empty_inputs[:5])}"
                 f"{', ...' if len(self.empty_inputs) > 5 else ''})" if self.empty_inputs else "")
        return "\n".join([
            f"dataset      {self.output}",
            f"inputs       {self.inputs:,} files{empty}",
            f"partitions   {self.partitions:,} -> {self.shards:,} shards "
            f"({self.resumed:,} phase-1 results reused from an earlier run)",
            f"documents    {self.docs_in:,} in, {self.docs_out:,} out",
            f"dropped      {reasons(self.dropped)}",
            f"quarantined  {reasons(self.quarantined)}",
            *([f"contaminated {reasons(self.contamination)} (contamination.json)"]
              if self.contamination else []),
            f"tokens       {self.tokens:,}",
            f"bytes        {self.bytes:,} (Parquet, zstd)",
            f"wall time    {self.wall_s:.2f} s",
            f"throughput   {self.tokens_per_s:,.0f} tokens/s",
            f"version      {self.version or 'unchanged (the same manifest as the latest version)'}",
            *(carbon.render(self.energy) if self.energy else []),
            *self.degraded,
        ])


def build_manifest(cfg: PipelineConfig, tok: tokenizing.TokenizerSpec,
                   ones: work.PhaseOneResults, twos: work.PhaseTwoResults,
                   inputs: tuple[int, str] | None = None) -> Manifest:
    """The manifest from the results (its shards are listed by the index, written from
    ``twos.shards`` in partition order, never completion order: :func:`with_shard_index`).

    ``inputs``: the input listing's file count and hash for ``lineage``
    (:func:`pipeline.lineage.provenance.listing_sha256`; ``None``: no lineage recorded)."""
    dropped: Counter[str] = Counter(ones.dropped)
    changed, quarantined = ones.changed, ones.quarantined
    dropped.update(twos.duplicates)
    totals = twos.shards.totals()
    stats = {
        "documents_in": ones.docs_in,
        "documents_out": totals.rows,
        "dropped": dict(sorted(dropped.items())),
        "changed": dict(sorted(changed.items())),
        "quarantined": dict(sorted(quarantined.items())),
        "tokens": totals.tokens,
        "bytes": totals.bytes,
        "partitions": ones.n,
    }
    # the columns the steps wrote, then those phase 2 added (dedup signals), last
    signals = dict(ones.signals)
    work.merge_signals(signals, twos.signals, -1)
    if signals:  # each with the step that wrote it
        stats["signals"] = {name: {"type": kind, "step": name.partition(".")[0]}
                            for name, kind in signals.items()}
    config = cfg.for_manifest()
    metadata, sources = _id_columns(cfg)
    record = {} if inputs is None else provenance.lineage(
        config.get("steps", []), {"name": tok.name, "sha256": tok.sha256,
                                  "vocab_size": tok.vocab_size},
        inputs, code_version(),
        provenance.IN_COLUMN if metadata or sources else provenance.IN_DOC_ID)
    return Manifest(
        tokenizer=TokenizerInfo(name=tok.name, path=tokenizer_name(tok.sha256), sha256=tok.sha256,
                                vocab_size=tok.vocab_size, eos_id=tok.eos_id,
                                eos_token=tok.eos_token, bytes=len(tok.json.encode("utf-8"))),
        shards=(), schema=schema_description(
            tokens.token_dtype(tok.vocab_size),
            metadata, {"source": "string", **signals} if sources else signals),
        config=config, stats=stats,
        quarantine=ones.quarantines(), lineage=record,
    )


def with_shard_index(store: ReplicaSet, manifest: Manifest, shards: ShardTable) -> Manifest:
    """``manifest`` naming the index of ``shards``, put first (content-addressed: a rerun
    rewrites the same bytes under the same name). The index is built in a local temporary
    file and sent from it (:mod:`pipeline.output.index_file`): never held whole in the driver."""
    with shards.build_index() as built:
        store.put(built.ref.path, built.path)
    return indexed(manifest, shards.totals(), built.ref)


def _train_tokenizer(client: Client, cfg: PipelineConfig, plan: PartitionPlan,
                     vocab: int, window: TaskWindow, limits: RecordLimits
                     ) -> tokenizing.TokenizerSpec:
    """Train on the first ``tokenizer_sample_bytes / P`` characters of every partition."""
    quota = max(1, cfg.tokenizer_sample_bytes // max(1, len(plan)))
    samples = window.map(lambda i: client.submit(
        sample_texts, plan[i], cfg.read_options, cfg.recipe, quota,
        HiddenOptions(cfg.storage_options), limits, pure=False,
        retries=cfg.retries), range(len(plan)))
    texts = [t for sample in samples for t in sample]  # partition order: deterministic
    return tokenizing.train_bpe(texts, vocab)


def _named(shard: dict[str, Any] | None, index: int) -> bool:
    try:
        return shard is None or shard["path"] == shard_name(index, shard["sha256"])
    except (KeyError, TypeError, ValueError):
        return False


def fold_phase_two(markers: Iterable[tuple[str, Any]], rkey: str, n: int,
                   twos: work.PhaseTwoResults) -> None:
    """Fold an earlier run's phase-2 markers (``(path, marker)`` pairs, a later pair for a
    path replacing an earlier: :func:`pipeline.tasks.work.stream_state`) into ``twos`` as they come,
    holding none of them: what folding the dict of the last pair per path would give.

    A marker counts where it is a dict under its own partition's path whose shard (if any) is
    under its content-addressed name; a later unusable one for that path forgets the earlier.
    """
    held: dict[str, int] = {}  # path -> the partition folded from it
    for path, d in markers:
        i = d.get("index") if isinstance(d, dict) else None
        usable = (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n
                  and path == work.done2_path(rkey, i) and _named(d.get("shard"), i))
        if usable:
            twos.add(work.PhaseTwo.from_dict(d))
            held[path] = i
        elif path in held:
            twos.discard(held.pop(path))


def reusable_phase_one(d: Any, params: StageParams) -> work.PhaseOne | None:
    """An earlier run's phase-1 marker as the driver keeps it
    (:func:`pipeline.tasks.work.counts_only`),
    or ``None`` where it is not reusable: a marker with rows but no shard entry (or, near-dup,
    no sketches) is from an older version, and the partition is redone."""
    if not work.reusable_marker(d) or needs_sketches(d, params):
        return None
    try:
        return work.counts_only(d)
    except (TypeError, ValueError, KeyError):  # fields this version does not know: redo it
        return None


def fold_phase_one(markers: Iterable[tuple[str, Any]], keys: Sequence[str],
                   params: StageParams) -> work.PhaseOneState:
    """An earlier run's phase-1 markers (``(path, marker)`` pairs, a later pair for a path
    replacing an earlier: :func:`pipeline.tasks.work.stream_state`) kept by partition as their
    counts, or as not reusable (:func:`reusable_phase_one`), holding none of them.

    A marker is placed by its ``index`` where its path is that partition's marker path (the
    key computed for it: no map of every path is held). One that is not (not a dict, another
    partition's index: damage) makes its path's partition be redone unless a later marker for
    it places; finding that partition computes every key once, in that rare case only.
    """
    n = len(keys)
    state = work.PhaseOneState(n)
    placed_at = np.zeros(n, dtype=np.int64)  # each partition's last placed marker, 1-based
    misplaced: dict[str, int] = {}  # path -> its last unplaceable marker, 1-based
    for seq, (path, d) in enumerate(markers, start=1):
        i = d.get("index") if isinstance(d, dict) else None
        if (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n
                and path == work.done1_path(keys[i])):
            state.put(i, reusable_phase_one(d, params))
            placed_at[i] = seq
        else:
            misplaced[path] = seq
    if misplaced:
        for i, k in enumerate(keys):
            seq = misplaced.get(work.done1_path(k))
            if seq is not None and placed_at[i] < seq:
                state.put(i, None)
    return state


def _phase_two_started(scratch: ReplicaSet) -> bool:
    """Whether any phase 2 or shuffle left files (under any run key): one small listing."""
    loc = scratch.replicas[0].loc
    try:
        return bool(loc.fs.ls(loc.path(f"{work.WORK_DIR}/p2"), detail=False))
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: read the phase-2 state


def _execute(client: Client, cfg: PipelineConfig, store: ReplicaSet,
             tok: tokenizing.TokenizerSpec, plan: PartitionPlan, bar: ProgressBar,
             workers: int, window: TaskWindow, limits: RecordLimits
             ) -> tuple[work.PhaseOneResults, work.PhaseTwoResults, int]:
    """Phase 1 of every partition, the dedup shuffle, phase 2: each through ``window``, so
    the tasks alive on the scheduler and in the driver are bounded by the cluster's size,
    never by the number of partitions.

    Partitions, their keys and their work-file names are made one at a time as tasks are
    submitted (``plan`` is compact, :class:`pipeline.planning.plan.PartitionPlan`); what earlier
    runs
    finished is read once per phase from the markers' ledgers
    (:func:`pipeline.tasks.work.stream_state`).
    Phase 1's results are folded into arrays and sums as they come
    (:class:`pipeline.tasks.work.PhaseOneResults`); a phase-2 task reads its partitions' phase-1
    results from their markers itself.
    """
    salt = json.dumps([cfg.for_manifest(), tok.sha256], sort_keys=True)
    keys = plan.keys(salt)
    n = len(plan)
    scratch = work.work_store(store)
    params = StageParams(cfg.read_options, cfg.cleaning, cfg.dedup == "exact", cfg.near_dup,
                         (cfg.minhash_perms, cfg.minhash_bands, cfg.shingle_words,
                          cfg.minhash_rows), tok.sha256,
                         tok.vocab_size, tok.eos_id, cfg.encode_batch_docs,
                         cfg.row_group_tokens, cfg.strict, cfg.storage_options,
                         web=cfg.web_config, shard_compression=cfg.shard_compression,
                         limits=limits, recipe=cfg.recipe)
    # Each marker kept as its counts (by partition, in arrays) as its ledger is read: the
    # dict of whole markers held every rows file's row groups (~70 GB at 100 TB), ~3 KB a
    # partition even without them (~30 GB at 10 M partitions of small files).
    stream1 = work.stream_state(scratch, work.DONE1_DIR)
    state1 = None if stream1 is None else fold_phase_one(stream1, keys, params)
    # The run key hashes every partition key: computed up front only when a phase 2 may have
    # left markers under it; otherwise while phase 1's tasks are submitted (below).
    rkey = work.run_key(keys) if _phase_two_started(scratch) else ""
    twos = work.PhaseTwoResults()
    if rkey:
        stream2 = work.stream_state(scratch, work.done2_dir(rkey))
        if stream2 is None:  # the store refuses to list: one read per partition
            stream2 = ((work.done2_path(rkey, i), work.get_json(scratch, work.done2_path(rkey, i)))
                       for i in range(n))
        fold_phase_two(stream2, rkey, n, twos)
    tag = uuid.uuid4().hex[:8]
    opts: dict[str, Any] = {"pure": False, "retries": cfg.retries}

    dedup = cfg.dedup == "exact" or cfg.near_dup
    # Whose work files this run still reads: every partition's keys while any phase 2 is
    # left to do under dedup, else only the rows of partitions whose phase 2 is left.
    read_all = dedup and len(twos) < n

    def done1(i: int, k: str | None) -> work.PhaseOne | None:
        if state1 is not None:
            return state1.get(i)
        return reusable_phase_one(work.get_json(scratch, work.done1_path(k or keys[i])),
                                  params)

    ones = work.PhaseOneResults(n)
    hasher = None if rkey else hashlib.sha256()
    bar.update(len(twos))

    def redo() -> Iterator[tuple[int, str, bool]]:
        for i in range(n):
            # A key is a hash (~4-5 us): made here only where it is used (the run key, a
            # marker to read, a task), not for a partition whose kept counts are reused
            # (10 M partitions: ~45 s of driver CPU, on top of the fold and the run key)
            k = keys[i] if hasher is not None or state1 is None else None
            if hasher is not None and k is not None:
                hasher.update((f"\n{k}" if i else k).encode())
            earlier = done1(i, k)
            # Work files written without fsync are verified by a task before they are read
            # again (a power loss may have kept the marker but not the files); a read, not a
            # redo, when they are fine. Where they are not read again, the marker's counts are
            # all we use.
            if earlier and (earlier.durable or not (read_all or i not in twos)):
                ones.add(earlier)
                bar.update(1)
            else:  # (True: an earlier result whose files its task verifies, or redoes)
                yield i, k if k is not None else keys[i], earlier is not None

    def submit_one(task: tuple[int, str, bool]) -> Future:
        i, k, again = task
        return client.submit(phase_one_again if again else phase_one, plan[i], k, store,
                             params, key=f"phase1-{i:05d}-{tag}", **opts)

    ledger1 = work.Compactor(scratch, work.DONE1_DIR)
    for _task, one in window.run(submit_one, redo()):
        if one.error:
            raise StrictModeError(one.error)
        ones.add(one)
        if not one.resumed:
            ledger1.add(work.done1_path(one.key), one)
        bar.update(1, 0 if one.resumed else one.tokens)
    ledger1.flush()
    if hasher is not None:
        rkey = hasher.hexdigest()[:24]  # == work.run_key(keys)

    todo2 = np.setdiff1d(np.arange(n, dtype=np.int64),
                         np.fromiter(twos.done, dtype=np.int64, count=len(twos)))
    drops: dict[int, shuffle.DropRange] = {}
    # dedup's own columns (--dedup-signals): every shard gets them, so every one is re-encoded
    signals = dedup_signals.names(cfg.dedup == "exact", cfg.near_dup) if cfg.dedup_signals \
        else ()
    if dedup and len(todo2):  # duplicates are known only once every partition's keys are
        drops = _dedup(client, cfg, store, n, keys, rkey, ones.rows, tag, opts, window,
                       bool(signals))
    if cfg.cluster_by:  # the column, now that the steps' signals are known
        cluster.check_signal(cfg.cluster_by, ones.signals, _fixed_columns(cfg, signals))
    # Re-encoded without their duplicates (or with dedup signals, or ordered by a column), one
    # task each; the others are linked or copied, several to a task.
    dropping = (np.ones(len(todo2), dtype=bool) if signals or cfg.cluster_by else
                np.isin(todo2, np.fromiter(drops, dtype=np.int64, count=len(drops))))
    kept = todo2[~dropping]

    def tails() -> Iterator[tuple[str, Any]]:
        for i in todo2[dropping]:
            yield "one", int(i)
        for lo, hi in task_groups(len(kept), workers):
            yield "group", [int(i) for i in kept[lo:hi]]

    def submit_two(task: tuple[str, Any]) -> Future:
        kind, what = task
        if kind == "one":
            return client.submit(_phase_two_at, keys[what], rkey, store,
                                 cfg.row_group_tokens, tok.vocab_size, drops.get(what),
                                 signals, cfg.cluster_by, key=f"phase2-{what:05d}-{tag}",
                                 **opts)
        return client.submit(_phase_two_each_at, [keys[i] for i in what], rkey, store,
                             cfg.row_group_tokens, tok.vocab_size,
                             key=f"phase2-{what[0]:05d}-{what[-1]:05d}-{tag}",
                             **opts)

    ledger2 = work.Compactor(scratch, work.done2_dir(rkey))
    for _task, result in window.run(submit_two, tails()):
        for two in result if isinstance(result, list) else [result]:
            twos.add(two)
            if not two.resumed:
                ledger2.add(work.done2_path(rkey, two.index), two)
        bar.update(len(result) if isinstance(result, list) else 1)
    ledger2.flush()
    return ones, twos, ones.resumed


def _dedup(client: Client, cfg: PipelineConfig, store: ReplicaSet, n: int,
           keys: Sequence[str], rkey: str, rows: np.ndarray, tag: str,
           opts: dict[str, Any], window: TaskWindow, signals: bool = False
           ) -> dict[int, shuffle.DropRange]:
    """The dedup shuffle (see :mod:`pipeline.dedup.shuffle`): where each partition's drops lie
    (with ``signals``, and its notes for dedup's columns: :mod:`pipeline.dedup.signals`).

    Runs once every phase 1 is done: their row counts size the buckets and the key groups
    (:func:`pipeline.dedup.shuffle.sizes`). Only counts come back to the driver: a group x bucket
    matrix of keys, a bucket x group one of drops, then a count per partition. Keys and drops
    stay in ``_work/``, so no worker ever holds the whole input's.
    """
    per_doc = (cfg.dedup == "exact") + (cfg.minhash_bands if cfg.near_dup else 0)

    def on_dask(name: str, fn: Callable[..., Any], args: list[tuple[Any, ...]]) -> list[Any]:
        return window.map(lambda i: client.submit(fn, *args[i], key=f"{name}-{i:07d}-{tag}",
                                                  **opts), range(len(args)))

    return shuffle.run(on_dask, store, rkey, keys,  # type: ignore[arg-type]
                       _Counts(rows, per_doc), cfg.dedup_buckets,
                       threshold=cfg.near_dup_threshold if cfg.near_dup else 0.0,
                       perms=cfg.minhash_perms, signals=signals).drops


class _Counts(Sequence[int]):
    """``rows * per_doc`` as the sequence of ints the shuffle takes, made as it is read:
    10 M partitions' counts as a list of Python ints would be ~360 MB."""

    def __init__(self, rows: np.ndarray, per_doc: int) -> None:
        self.rows, self.per_doc = rows, per_doc

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [int(r) * self.per_doc for r in self.rows[i]]
        return int(self.rows[i]) * self.per_doc

    def __iter__(self) -> Iterator[int]:
        for lo in range(0, len(self.rows), 1 << 16):
            for r in self.rows[lo:lo + (1 << 16)].tolist():
                yield r * self.per_doc


def _phase_two_at(key: str, run_key: str, store: ReplicaSet, row_group_tokens: int,
                  vocab_size: int, drop: Any = None, signals: tuple[str, ...] = (),
                  cluster_by: str = "") -> work.PhaseTwo:
    """Phase 2 of the partition whose phase 1 left its marker under ``key`` (read here, on
    the worker: the driver keeps no per-partition result, :class:`work.PhaseOneResults`)."""
    return phase_two(work.load_one(store, key), run_key, store, row_group_tokens, vocab_size,
                     drop, signals, cluster_by)


def _id_columns(cfg: PipelineConfig) -> tuple[bool, bool]:
    """Does a run write the web metadata columns (web inputs or a language filter), and a
    ``source`` column of its own (``--id-field`` without them)?"""
    metadata = cfg.web_config is not None and cfg.web_config.metadata
    return metadata, cfg.read_options.id_field is not None and not metadata


def _fixed_columns(cfg: PipelineConfig, dedup_columns: Sequence[str]) -> list[str]:
    """The columns a run's shards have besides the steps' signals and the doc id."""
    metadata, sources = _id_columns(cfg)
    return [*(META_COLUMNS if metadata else ()), *(["source"] if sources else []),
            *dedup_columns]


def _phase_two_each_at(keys: list[str], run_key: str, store: ReplicaSet,
                       row_group_tokens: int, vocab_size: int) -> list[work.PhaseTwo]:
    """:func:`pipeline.tasks.stages.phase_two_each` of partitions named by their keys; their
    markers are read a few at a time."""
    with ThreadPoolExecutor(8) as pool:
        ones = list(pool.map(lambda k: work.load_one(store, k), keys))
    return phase_two_each(ones, run_key, store, row_group_tokens, vocab_size)


T = TypeVar("T")


def _in_background(fn: Callable[..., T], *args: Any) -> futures.Future[T]:
    pool = ThreadPoolExecutor(1, thread_name_prefix="shardflow-driver")
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)


def run(cfg: PipelineConfig, log: TextIO | None = None, progress: bool = True) -> RunSummary:
    """Build the dataset ``cfg`` describes, holding the output's writer lease throughout.

    A second run into the same output fails at once naming the holder (or waits, with
    ``cfg.wait``); the lease is released at the end, also when the run fails.
    """
    log = log or sys.stderr
    store = cfg.output_store()
    lease = hold_replicas(store, "run", ttl_s=cfg.lease_ttl, wait=cfg.wait, log=log)
    try:
        return _run(cfg, store, lease, log, progress)
    finally:
        lease.release()


#: the input probe picks from at most this many URLs (evenly spread over a longer list)
PROBE_CANDIDATES = 200_000


def _probe_candidates(files: FileTable) -> list[str]:
    """The URLs :func:`pipeline.driver.worker_checks.probe_inputs` samples from: all of them up to
    :data:`PROBE_CANDIDATES`, else that many evenly spread (10 M URLs as strings would cost
    the driver ~1 GB for a sample of 36)."""
    n = len(files)
    picks = range(n) if n <= PROBE_CANDIDATES else (
        i * n // PROBE_CANDIDATES for i in range(PROBE_CANDIDATES))
    return [files.url(i) for i in picks]


def _run(cfg: PipelineConfig, store: ReplicaSet, lease: ReplicaLeases, log: TextIO,
         progress: bool) -> RunSummary:
    start = time.perf_counter()
    limits = RecordLimits(cpu_s=cfg.record_cpu_s, wall_s=cfg.record_wall_s)
    meter = carbon.CarbonRun(cfg, log)  # energy from here on; a bad --carbon-signal fails here
    vocab = tokenizing.trained_vocab(cfg.tokenizer)
    tokenizing.check(cfg.tokenizer)
    if cfg.url_blocklist:  # missing, a FIFO, too long: said here, not by every task
        from pipeline.web.urls import load_blocklist

        load_blocklist(cfg.url_blocklist, cfg.storage_options)
    # The tokenizer loads while the inputs are listed and the cluster starts; its errors
    # surface below, where its result is needed (a missing path fails here, at once).
    loading = None if vocab else _in_background(tokenizing.load, cfg.tokenizer, cfg.eos_token)
    files = discover_table(cfg.inputs or ([] if cfg.inputs_from else default_corpus()),
                           cfg.storage_options, cfg.inputs_from)
    total_bytes = files.total_bytes
    if not cfg.partition_bytes:  # resolved here, so the manifest records the size used
        cfg = replace(cfg, partition_bytes=auto_partition_bytes(total_bytes))
    if files.any_format(FORMAT_CODES.index("warc")):  # the web steps and columns
        cfg = replace(cfg, web_inputs=True)
        if "extract" not in {s.use for s in cfg.recipe.steps}:
            print("shardflow: warning: WARC inputs and a recipe without an 'extract' step: "
                  "HTML pages are tokenized as they are", file=log)
    plan = PartitionPlan(files, cfg.partition_bytes, cfg.files_per_partition)
    # A dataset already committed at the output stays readable, untouched, until the commit
    # below: every object this run writes has a name made from its content.
    where = " + ".join(display_url(r.loc.url) for r in store.replicas)
    print(f"shardflow: {len(files)} files, {total_bytes:,} bytes -> {len(plan)} partitions "
          f"-> {where}", file=log)
    if files.spilled:  # past filetable.SPILL_ROWS files: the table's size and where it is
        print(f"shardflow: {files.spill_note()}", file=log)
    empty = tuple(display_url(u) for u in files.empty_urls()[1])
    if empty:
        print(f"shardflow: {len(empty)} empty input files (0 bytes): "
              f"{', '.join(empty[:5])}{', ...' if len(empty) > 5 else ''}", file=log)

    with dask_client(cfg.n_workers, cfg.scheduler, cfg.dashboard_address,
                     cfg.tokenizer_threads, cfg.adapt_range, cfg.worker_ttl) as client, \
            watch(client, log, external=bool(cfg.scheduler)):  # a line per hung or lost worker
        dashboard = client.dashboard_link
        n = len(client.scheduler_info(n_workers=-1).get("workers", {}))
        print(f"dask: {n} workers, dashboard {dashboard}", file=log)
        probe_inputs(client, _probe_candidates(files), cfg.storage_options, log)  # before writes
        check_on_workers(client, cfg.recipe)  # a user step no worker can import: said here
        window = TaskWindow(client)
        meter.attach(client, window, total_bytes, window.threads())  # may gate the window
        tok = (loading.result() if loading else
               _train_tokenizer(client, cfg, plan, vocab, window, limits))
        print(f"tokenizer: {tok.name} (vocab {tok.vocab_size}, eos {tok.eos_token!r})", file=log)
        store.put(tokenizer_name(tok.sha256), tok.json.encode("utf-8"))
        bar = ProgressBar(2 * len(plan), label="tasks", enabled=progress, stream=log)
        meter.track(bar)
        ones, twos, resumed = _execute(client, cfg, store, tok, plan, bar, max(1, n), window,
                                       limits)
        meter.finish()
    check_not_all_unreadable([ones.total()], store)  # never commit a dataset of unreadable inputs

    listed = build_manifest(cfg, tok, ones, twos, provenance.listing_sha256(files))
    # each partition's record of what its steps dropped, then of its duplicates: named by one
    # list the manifest names (put first, content-addressed), not inline in the manifest
    drops = [d for i in sorted(set(ones.drops) | set(twos.drops))
             for d in (ones.drops.get(i), twos.drops.get(i)) if d is not None]
    listed = replace(listed, drops=write_object_list(store, drops, drops_list_name))
    # decontamination's report, put before the swap; its sha256 in stats.contamination
    listed = with_report(store, listed, build_report(cfg.recipe, ones.reports.merged()))
    energy = meter.record(listed.stats["tokens"])
    if cfg.record_energy:
        listed = carbon.with_energy(listed, energy)
    # The row-group index goes before the swap (content-addressed: a rerun rewrites the same
    # bytes under the same name); the manifest then names it instead of listing the shards.
    manifest = with_shard_index(store, listed, twos.shards)
    twos.shards.close()  # the records' local disk back now
    if cfg.card:  # before the swap, like every object of the version (keyed by its manifest)
        from pipeline.output.card import write_at_commit

        write_at_commit(store, manifest, log)
    lease.check()  # still ours: no other run can be using _work/ or committing
    recorded = commit(store, manifest, log)  # the swap of manifest.json: last, atomic
    work.remove_work(store)
    stats = manifest.stats
    return RunSummary(
        output=where, partitions=len(plan), shards=manifest.counts.shards,
        docs_in=stats["documents_in"], docs_out=stats["documents_out"],
        dropped=stats["dropped"], quarantined=stats["quarantined"], tokens=stats["tokens"],
        bytes=stats["bytes"], wall_s=time.perf_counter() - start, dashboard=dashboard,
        resumed=resumed,
        version=f"{recorded.sequence} ({recorded.path})" if recorded else "",
        degraded=tuple(describe_degraded(store, {recorded.tag: recorded.sequence}
                                         if recorded else None)),
        inputs=len(files), empty_inputs=empty,
        extra={"max_live_tasks": float(window.max_live), "tasks": float(window.submitted)},
        energy=energy,
        contamination=dict(stats.get("contamination", {}).get("documents", {})),
    )
