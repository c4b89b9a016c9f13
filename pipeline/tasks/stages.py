"""The tasks Dask runs. Each returns small results; documents never travel to the driver.

Phase 1, per partition: parse → clean → dedup keys → tokenize; rows and keys go to ``_work/``,
rejects to ``quarantine/``, with the records a limit refuses (:mod:`pipeline.tasks.record_steps`;
after an attempt lost with its worker, each record runs in isolation:
:mod:`pipeline.tasks.isolation`).
The rows are already the partition's finished shard, bytes and
manifest entry, as if no duplicate were dropped. Dedup, across partitions, is
``pipeline.dedup.shuffle``: keys are split by hash into buckets, each bucket is resolved on its own,
and each partition picks its condemned rows from every bucket. Phase 2, per partition: a
partition that lost no row has its shard copied into place; one that did is re-encoded.

Every object written outside ``_work/`` is named by its content (``storage.format.layout``): a rerun
writes its shards next to the committed version's, never over them, and identical content
lands on the identical name.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.cleaning import CleaningConfig
from pipeline.dedup import (
    DROP,
    ENTRY,
    KIND_EXACT,
    KIND_NEAR,
    MinHasher,
    content_key,
    entries,
    shuffle,
)
from pipeline.dedup import signals as dedup_signals
from pipeline.lineage import records as lineage
from pipeline.output import cluster
from pipeline.output.shards import (
    DEFAULT_CODEC,
    ShardWriter,
    shard_codec,
    shard_schema,
    shard_table,
)
from pipeline.planning.plan import Partition
from pipeline.readers import ReadOptions, read_partition
from pipeline.records import Document, Rejected, raw_preview
from pipeline.steps.recipe import Recipe
from pipeline.steps.shorthand import recipe_of
from pipeline.tasks import tokenizing, work
from pipeline.tasks.isolation import steps_for
from pipeline.tasks.record_steps import Poisoned, RecordLimits
from pipeline.web import WebConfig
from storage import (
    ObjectInfo,
    ReplicaSet,
    ShardInfo,
    digest_bytes,
    display_url,
    quarantine_name,
    shard_name,
    tokenizer_name,
    tokens,
)

#: stop filling an encode batch at this many characters, whatever the document count
BATCH_CHARS = 1 << 20


@dataclass(frozen=True)
class StageParams:
    """Everything a phase-1 task needs besides its partition (small, pickled per task)."""

    read: ReadOptions
    cleaning: CleaningConfig
    dedup: bool
    near_dup: bool
    minhash: tuple[int, ...]  # perms, bands, shingle words[, rows per band (0: perms/bands)]
    tokenizer_sha256: str
    vocab_size: int
    eos_id: int | None
    encode_batch_docs: int
    row_group_tokens: int
    strict: bool
    # Credentials may be in here: never in a repr, so never in Dask's "Compute Failed" logs.
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    #: the web steps (pipeline.web): extraction, language, rule sets, PII; None: off
    web: WebConfig | None = None
    #: the shards' Parquet codec (``--shard-compression``: zstd, lz4, none)
    shard_compression: str = DEFAULT_CODEC
    #: what one record's steps may cost (:mod:`pipeline.tasks.record_steps`,
    #: :mod:`pipeline.tasks.isolation`)
    limits: RecordLimits = field(default_factory=RecordLimits)
    #: the steps (:mod:`pipeline.steps`); ``None``: the recipe of ``cleaning`` and ``web``
    recipe: Recipe | None = None

    @property
    def steps(self) -> Recipe:
        return self.recipe if self.recipe is not None else recipe_of(self.cleaning, self.web)


@dataclass(frozen=True)
class HiddenOptions:
    """Storage options passed to a task on their own, kept out of reprs (and so of logs)."""

    value: dict[str, Any] | None = field(default=None, repr=False)


_TOKENIZERS: dict[str, str] = {}


def _tokenizer_json(store: ReplicaSet, sha256: str) -> str:
    """The run's tokenizer, fetched once per worker process (content-addressed by sha256)."""
    if sha256 not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[sha256] = store.get(tokenizer_name(sha256), sha256=sha256).decode("utf-8")
    return _TOKENIZERS[sha256]


@functools.lru_cache(maxsize=2)
def _minhasher(perms: int, bands: int, words: int, rows: int = 0) -> MinHasher:
    return MinHasher(perms, bands, words, rows=rows)


def named(index: int, shard: ShardInfo) -> ShardInfo:
    """The shard entry under its final, content-addressed name."""
    return replace(shard, path=shard_name(index, shard.sha256))


def put_quarantine(store: ReplicaSet, index: int, records: list[dict]) -> ObjectInfo:
    """Rejected records as JSON lines (source file:line, reason, detail, raw text), under a
    name made from their content."""
    body = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
    data = body.encode("utf-8")
    sha = digest_bytes(data)
    info = ObjectInfo(path=quarantine_name(index, sha), bytes=len(data), sha256=sha)
    store.put(info.path, data)
    return info


def strict_message(item: Rejected) -> str:
    return f"bad record at {item.source} (file {item.file}): {item.reason}: {item.detail}"


def poisoned(part: Partition, doc: Document, bad: Poisoned) -> Rejected:
    """A document a limit refused, as a quarantined record: ``file@offset`` for web records,
    the document's id (``file:line`` unless ``--id-field``) otherwise."""
    where = doc.source or doc.doc_id
    shown = (display_url(part.url) if not part.members
             else doc.source.rpartition("@")[0] if doc.source else "")
    return Rejected(where, bad.reason, bad.detail, raw_preview(doc.text), shown)


T = TypeVar("T")


def chunks(items: Iterable[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive groups of ``size`` (the last may be shorter); ``size`` 1 gives
    each item alone without building lists."""
    if size == 1:
        for item in items:
            yield (item,)
        return
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def phase_one(part: Partition, key: str, store: ReplicaSet, p: StageParams,
              reuse: work.PhaseOne | None = None) -> work.PhaseOne:
    """Parse, clean and tokenize one partition into work files (see :mod:`pipeline.tasks.work`).

    ``reuse``: an earlier run's result for this partition whose work files were not synced;
    it is returned as it is when they verify (:func:`pipeline.tasks.work.intact`), redone otherwise.
    """
    scratch = work.work_store(store)
    if reuse is not None and work.intact(scratch, reuse) and not needs_sketches(reuse, p):
        return reuse
    tok_json = _tokenizer_json(store, p.tokenizer_sha256)
    hasher = _minhasher(*p.minhash) if p.near_dup else None
    # in the worker, or in isolation when an earlier attempt was lost with its worker
    steps = steps_for(p.steps, p.storage_options, p.limits,
                      f"phase 1 of partition {part.index} ({display_url(part.url)})")
    dtype = tokens.token_dtype(p.vocab_size)
    rejected: list[dict[str, str]] = []
    # Streamed: each encode batch goes to the shard writer (which holds at most one row group
    # of it), its dedup keys and near-dup sketches (``perms`` bytes a row) to spool files, so
    # memory does not grow with the partition.
    doc_ids: list[str] = []
    batch: list[str] = []
    batch_chars = 0
    keys: list[bytes] = []
    sketches: list[np.ndarray] = []
    positions: list[int] = []
    kinds: list[int] = []
    docs_in = rows = n_tokens = 0
    # lineage: what each step dropped (source, step, reason), and, where the id is not the
    # source (--id-field, not a web run: those have the column already), a source column
    step_drops: list[dict[str, Any]] = []
    sources: list[str] | None = [] if p.read.id_field and not p.steps.metadata else None

    def flush() -> None:
        nonlocal doc_ids, batch, batch_chars, keys, sketches, positions, kinds, n_tokens
        steps.idle()  # the CPU guard is for a record's steps, not for a batch's encoding
        if batch:
            ln, vals = tokenizing.encode_flat(tok_json, p.eos_id, batch)
            columns = steps.take()
            if sources is not None:
                columns = {"source": pa.array(sources, pa.string()), **(columns or {})}
                sources.clear()
            writer.add(shard_table(doc_ids, tokens.pack(ln, vals, dtype), columns), ln)
            n_tokens += int(vals.size)
        if keys:
            spool.append(entries(keys, positions, kinds))
        if sketches:
            sketch_spool.append(np.concatenate(sketches))
        doc_ids, batch, batch_chars, keys, positions, kinds = [], [], 0, [], [], []
        sketches = []

    # the shard's columns (tokens, web metadata, signals) come with its first batch
    with ShardWriter(dtype, p.row_group_tokens, None, p.shard_compression) as writer:
        spool = work.ArraySpool(ENTRY)
        sketch_spool = work.ArraySpool(np.uint8)
        sketches_sha256 = ""
        try:
            group = steps.batch_size  # > 1: a step scores documents in batches
            for chunk in chunks(read_partition(part, p.read, p.storage_options), group):
                outcomes = None if group == 1 else iter(
                    steps.run([it for it in chunk if not isinstance(it, Rejected)]))
                for item in chunk:
                    if isinstance(item, Rejected):
                        if p.strict:  # reported to the driver, which stops the run
                            return work.PhaseOne(part.index, key, error=strict_message(item))
                        rejected.append(asdict(item))
                        continue
                    try:
                        text = steps(item) if outcomes is None else steps.settle(next(outcomes))
                    except Poisoned as bad:  # quarantined like a reader's reject
                        refused = poisoned(part, item, bad)
                        if p.strict:
                            return work.PhaseOne(part.index, key, error=strict_message(refused))
                        rejected.append(asdict(refused))
                        continue
                    docs_in += 1
                    if text is None:
                        step, reason = steps.last_drop or ("", "")
                        step_drops.append(lineage.step_line(item.source or item.doc_id,
                                                            step, reason))
                        continue
                    pos = rows
                    rows += 1
                    if p.dedup:
                        keys.append(content_key(text))
                        positions.append(pos)
                        kinds.append(KIND_EXACT)
                    if hasher is not None:
                        bands, sketch = hasher.keys_and_sketch(text)
                        sketches.append(sketch)
                        keys += bands
                        positions += [pos] * len(bands)
                        kinds += [KIND_NEAR] * len(bands)
                    doc_ids.append(item.doc_id)
                    if sources is not None:
                        sources.append(item.source or item.doc_id)
                    steps.keep()
                    batch.append(text)
                    batch_chars += len(text)
                    if len(batch) >= p.encode_batch_docs or batch_chars >= BATCH_CHARS:
                        flush()
            flush()
            shard = None
            if rows:
                # Written as the final shard: most partitions lose no row to dedup, and theirs
                # is then only verified and linked (or copied) into place by phase 2.
                data, shard = writer.finish()
                shard = named(part.index, shard)
                scratch.put(work.rows_path(key), data)
                del data
            keys_sha256 = spool.save(scratch, work.keys_path(key))
            if hasher is not None:
                sketches_sha256 = sketch_spool.save(scratch, work.sketches_path(key))
        finally:
            steps.close()
            spool.close()
            sketch_spool.close()
    quarantine = put_quarantine(store, part.index, rejected) if rejected else None
    drops = lineage.put_record(store, part.index, lineage.STEPS, step_drops)
    result = work.PhaseOne(
        index=part.index, key=key, docs_in=docs_in + len(rejected), rows=rows,
        tokens=n_tokens, dropped=dict(steps.dropped), changed=dict(steps.changed),
        quarantined=dict(Counter(r["reason"] for r in rejected)), quarantine=quarantine,
        shard=shard, keys_sha256=keys_sha256, sketches_sha256=sketches_sha256,
        durable=not scratch.primary.is_local, signals=steps.signal_types() if rows else {},
        reports=steps.reports(), drops=drops)
    work.put_json(scratch, work.done1_path(key), work.marker(result))
    return result


def phase_one_again(part: Partition, key: str, store: ReplicaSet, p: StageParams
                    ) -> work.PhaseOne:
    """:func:`phase_one` of a partition an earlier run finished without syncing its work
    files: its whole marker is read here, on the worker (a rerun's driver keeps its counts
    only, and reading ~10 M markers one by one in the driver would take minutes), and the
    files are verified against it."""
    return phase_one(part, key, store, p, work.load_reusable(store, key))


def needs_sketches(one: work.PhaseOne | dict[str, Any], p: StageParams) -> bool:
    """Whether an earlier phase 1 (a result or its marker) lacks the near-dup sketches this
    run verifies candidates with (written by a run without near-dup, or by an older
    version): then the partition is redone."""
    rows, sha = ((one.rows, one.sketches_sha256) if isinstance(one, work.PhaseOne)
                 else (one.get("rows"), one.get("sketches_sha256")))
    return p.near_dup and bool(rows) and not sha


def phase_two(one: work.PhaseOne, run_key: str, store: ReplicaSet, row_group_tokens: int,
              vocab_size: int, picked: shuffle.DropRange | None = None,
              signals: tuple[str, ...] = (), cluster_by: str = "") -> work.PhaseTwo:
    """The partition's final shard: phase 1's, linked or copied, or re-encoded without its
    duplicates.

    ``picked``: where this partition's drops lie (:func:`pipeline.dedup.shuffle.pick` reads them,
    merged across dedup buckets: a document condemned by several, exact and near, is dropped
    once, as its first kind).

    ``signals``: dedup's own columns (``--dedup-signals``, :mod:`pipeline.dedup.signals`),
    added after the shard's others from the partition's notes
    (:func:`pipeline.dedup.shuffle.pick_notes`): the shard is then re-encoded even where it lost no
    row.

    ``cluster_by`` (``--cluster-by``): the shard is re-encoded with its rows ordered by that
    column (:mod:`pipeline.output.cluster`); the partition's duplicates record then also says
    where each phase-1 row went (:func:`pipeline.lineage.records.order_line`), so ``trace``
    still finds the document a duplicate duplicates.

    Either way the bytes are what encoding the surviving rows gives, so they do not depend on
    whether a partition lost rows in this run or in which order things happened.
    """
    index = one.index
    scratch = work.work_store(store)
    drops = shuffle.pick(store, picked) if picked is not None else np.zeros(0, dtype=DROP)
    shard, duplicates, same_as, added = None, {}, None, {}
    left_out: list[str] = []  # the duplicates' sources, in position order (lineage)
    placed: list[np.ndarray] = []  # with cluster_by: each surviving row's place (lineage)
    if one.shard is not None:
        if not len(drops) and not signals and not cluster_by:
            # Verified on the way: a damaged work file must not become a shard. The verified
            # work file itself becomes the shard where the store can link it.
            data = scratch.get(work.rows_path(one.key), sha256=one.shard.sha256)
            shard, same_as = named(index, one.shard), work.rows_path(one.key)
        else:
            exact = int((drops["kind"] == KIND_EXACT).sum())
            duplicates = {k: v for k, v in (("duplicate", exact),
                                            ("near_duplicate", len(drops) - exact)) if v}
            extra = None
            if signals:
                notes = (shuffle.pick_notes(store, picked) if picked is not None
                         else np.zeros(0, dtype=dedup_signals.NOTE))
                extra = dedup_signals.columns(index, one.shard.rows, notes, signals)
            data, shard = _without(scratch, one, drops["pos"], tokens.token_dtype(vocab_size),
                                   row_group_tokens, extra, left_out, cluster_by, placed)
            if shard is not None and extra:
                added = dict.fromkeys(extra, dedup_signals.TYPE)
        if shard is not None:
            shard = named(index, shard)
            store.put(shard.path, data, same_as=same_as)
    kinds = {KIND_EXACT: "duplicate", KIND_NEAR: "near_duplicate"}
    record = lineage.put_record(store, index, lineage.DUPS, [
        lineage.dup_line(src, kinds[int(d["kind"])], int(d["pos"]), int(d["keep_part"]),
                         int(d["keep_pos"]))
        for src, d in zip(left_out, np.sort(drops, order="pos"), strict=True)]
        + [lineage.order_line(p) for p in placed
           if not np.array_equal(p, np.arange(len(p)))])
    result = work.PhaseTwo(index, shard, duplicates, signals=added, drops=record)
    work.put_json(scratch, work.done2_path(run_key, index), work.marker(result))
    return result


def _without(scratch: ReplicaSet, one: work.PhaseOne, dropped: np.ndarray, dtype: np.dtype,
             row_group_tokens: int, extra: dict[str, np.ndarray] | None = None,
             left_out: list[str] | None = None, cluster_by: str = "",
             placed: list[np.ndarray] | None = None) -> tuple[bytes, ShardInfo | None]:
    """Phase 1's shard re-encoded without the rows at positions ``dropped``, a row group at a
    time: the bytes :func:`pipeline.output.shards.encode_table` gives on the surviving rows. It
    holds
    phase 1's bytes (verified on the way: a damaged work file must not become a shard) and one
    row group of rows, then, once those are gone, the new shard's bytes for the put. The new
    shard keeps phase 1's codec (``--shard-compression``), read from its metadata.

    ``extra``: int64 columns to add after the shard's own (dedup signals), a value for each
    of phase 1's rows, dropped ones included (taken with the kept rows).

    ``left_out``: gets the dropped rows' sources (the ``source`` column, else the doc id),
    in row order, for the lineage's record of duplicates.

    ``cluster_by``: the surviving rows are ordered by that column
    (:mod:`pipeline.output.cluster`), which holds them all until the shard is written (a
    partition's rows, not one row group's); ``placed`` then gets, for each surviving row in
    phase 1's order, its row in the new shard (what the lineage needs to find it)."""
    assert one.shard is not None
    source = pq.ParquetFile(pa.BufferReader(
        scratch.get(work.rows_path(one.key), sha256=one.shard.sha256)))
    keep = np.ones(source.metadata.num_rows, dtype=bool)
    keep[dropped] = False
    schema = shard_schema(source.schema_arrow)
    extra = extra or {}
    clash = sorted(set(extra) & set(schema.names))
    if clash:
        raise ValueError(f"partition {one.index}: a step already wrote {clash[0]!r}, "
                         "a column of --dedup-signals")
    for name in extra:
        schema = schema.append(pa.field(name, pa.int64()))
    held: list[pa.Table] = []  # with cluster_by: every surviving row, then ordered
    with ShardWriter(dtype, row_group_tokens, schema, shard_codec(source.metadata)) as writer:
        at = 0
        for i in range(source.num_row_groups):
            group = source.read_row_group(i)
            mask = keep[at:at + group.num_rows]
            kept = group.filter(pa.array(mask))
            if left_out is not None and not mask.all():
                named = group.column("source" if "source" in group.column_names else "doc_id")
                left_out += named.filter(pa.array(~mask)).to_pylist()
            if extra:
                kept = pa.Table.from_arrays(
                    [*kept.columns, *(pa.array(col[at:at + group.num_rows][mask], pa.int64())
                                      for col in extra.values())], schema=schema)
            if cluster_by:
                held.append(kept)
            else:
                writer.add(kept)
            at += group.num_rows
            del group
        source.close()
        del source
        if held:
            rows, where = cluster.clustered(pa.concat_tables(held), cluster_by)
            held.clear()
            writer.add(rows)
            if placed is not None:
                placed.append(where)
        return writer.finish() if writer.rows else (b"", None)


def phase_two_each(ones: list[work.PhaseOne], run_key: str, store: ReplicaSet,
                   row_group_tokens: int, vocab_size: int) -> list[work.PhaseTwo]:
    """:func:`phase_two` for partitions that lost no row, one after another, in one task.

    Each is a verified read and a link or server-side copy, milliseconds: one task each cost
    as much again in scheduling (see :func:`pipeline.planning.plan.task_groups`).
    """
    return [phase_two(one, run_key, store, row_group_tokens, vocab_size) for one in ones]


def sample_texts(part: Partition, read: ReadOptions, recipe: Recipe, quota: int,
                 options: HiddenOptions, limits: RecordLimits | None = None) -> list[str]:
    """The first ``quota`` characters of documents after the recipe's steps: a
    tokenizer-training sample. Records run under the same limits as phase 1's (a refused one
    is left out)."""
    steps = steps_for(recipe, options.value, limits or RecordLimits(),
                      f"the tokenizer sample of partition {part.index}")
    out: list[str] = []
    size = 0
    try:
        for item in read_partition(part, read, options.value):
            if isinstance(item, Rejected):
                continue
            try:
                text = steps(item)
            except Poisoned:
                continue
            if text is None:
                continue
            out.append(text[: quota - size])
            size += len(out[-1])
            if size >= quota:
                break
    finally:
        steps.close()
    return out
