"""``python -m pipeline export``: the dataset in layouts that other tools read natively.

Shards keep token ids as one ``binary<uint16le>`` value per document because that decodes
fastest, but pandas, DuckDB, Polars and HF ``datasets`` see it as opaque bytes. Export rewrites
the committed version as:

- ``parquet-list``: ``part-NNNNN.parquet`` per shard, ``doc_id: string``,
  ``input_ids: list<int32>`` (zstd), then the shard's other columns with their types: a web
  run's metadata (``url``, ``date``, ``source``, ``lang``, ``lang_score``) and the steps'
  signal columns (``<step>.<signal>``: ``int64``, ``double``, ``bool``, ``string``);
- ``jsonl``: ``part-NNNNN.jsonl`` per shard, ``{"doc_id": ..., "input_ids": [...], ...}`` per
  line, metadata and signals included;
- ``hf``: a Hub-ready folder: ``data/part-NNNNN.parquet`` as above plus a ``README.md``
  dataset card whose YAML names the files, so ``datasets.load_dataset(PATH)`` or
  ``push_to_hub`` take it as it is.

Every part has the same columns, in the same order, with the same types (:func:`
export_schema`): the first shard's columns, then any other column the manifest's schema
lists, typed as the manifest says. A shard without one of them (a user's step may write a
signal into some shards only) gets nulls there; a column an int-valued shard wrote as
``int64`` that the manifest types ``double`` is cast. Readers that take a folder of Parquet
files as one table (pandas, DuckDB, Polars, HF datasets) need one schema.

A view (``python -m pipeline select``) exports only the documents it keeps: its source's
shards are read and checked as the source's, then each row group is masked.

Streaming: one shard is read (checksum-verified) and written at a time, row group by row
group, so memory is bounded by a shard whatever the dataset's size. Output names depend on the
shard's position only, and the bytes on its content: an export is reproducible.

Each shard passes the checks ``storage verify`` makes (:func:`storage.admin.verify.
check_object`, on the bytes already read: no second read) before it is written: its size,
row-group ranges and digests, footer, and the token and row counts the index gives it. An
index whose checksums were recomputed over crafted counts passed export's sha256 check alone
while verify and the loader refused it. A shard that fails stops the export with one error
naming the shard and the field; the parts written before it stay.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.driver.progress import ProgressBar
from storage import (
    Manifest,
    ManifestError,
    ReplicaSet,
    ShardInfo,
    resolve,
    shards_of,
    tokens,
    write_atomic,
)
from storage.admin.verify import check_object
from storage.format.checksums import PIECE_DIGEST, SHA256
from storage.format.index import digest_algorithm
from storage.io.urls import Location
from storage.io.view_store import physical_shard, read_masks, source_store

FORMATS = ("parquet-list", "jsonl", "hf")
LIST_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False),
                         pa.field("input_ids", pa.list_(pa.int32()), nullable=False)])


@dataclass
class ExportSummary:
    output: str
    files: int
    documents: int
    tokens: int

    def render(self) -> str:
        return (f"exported {self.documents:,} documents, {self.tokens:,} tokens "
                f"-> {self.files} files under {self.output}")


def export_schema(manifest: Manifest, first: pa.Schema) -> pa.Schema:
    """The schema of every exported part: :data:`LIST_SCHEMA`, then the columns of the first
    shard (``first``) in its order, then the manifest's other columns in its order; each
    typed as the manifest's schema types it (``int64``, ``double``, ``bool``, ``string``,
    ``float``, ...), else as the shard has it."""
    fields = {f.name: f for f in first if f.name not in ("doc_id", "input_ids")}
    for name, kind in manifest.schema.items():
        if name in ("doc_id", "input_ids"):
            continue
        try:
            typed = pa.type_for_alias(kind)
        except ValueError:  # not an Arrow type name: the shard's own type, if it has one
            continue
        fields[name] = pa.field(name, typed)
    return pa.schema([*LIST_SCHEMA, *fields.values()])


def list_batches(data: bytes, encoding: str, schema: pa.Schema | None = None,
                 keep: list[np.ndarray] | None = None) -> Iterator[pa.RecordBatch]:
    """A shard's row groups as ``doc_id`` + ``input_ids: list<int32>`` record batches, plus
    the shard's other columns (metadata, signals), in the shard's order, or, given
    ``schema`` (:func:`export_schema`), as it orders and types them: a column the shard lacks
    is nulls, one of another type is cast; a column ``schema`` lacks is a ``ManifestError``.
    ``keep``: a view's masks, one per row group: only the kept documents."""
    shard = pq.ParquetFile(io.BytesIO(data))
    if schema is None:
        schema = pa.schema([*LIST_SCHEMA, *(f for f in shard.schema_arrow
                                             if f.name not in ("doc_id", "input_ids"))])
    extra_names = set(shard.schema_arrow.names) - set(schema.names)
    if extra_names:
        raise ManifestError(f"column {sorted(extra_names)[0]!r} of this shard is neither in the "
                            "first shard nor in the manifest's schema: no one schema fits "
                            "every exported part")
    meta = list(schema)[len(LIST_SCHEMA):]
    for i in range(shard.num_row_groups):
        table = shard.read_row_group(i)
        if keep is not None:
            if len(keep[i]) != table.num_rows:
                raise ManifestError(f"row group {i}: {table.num_rows} documents, the view's "
                                    f"masks say {len(keep[i])}")
            table = table.filter(pa.array(keep[i]))
        column = table.column("input_ids")
        lengths = tokens.lengths(column, encoding).astype(np.int64)
        values = tokens.unpack(column, encoding).astype(np.int32, copy=False)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        extra = [_column(table, f) for f in meta]
        yield pa.RecordBatch.from_arrays([table.column("doc_id").combine_chunks(), ids, *extra],
                                         schema=schema)


def _column(table: pa.Table, field: pa.Field) -> pa.Array:
    if field.name not in table.column_names:
        return pa.nulls(table.num_rows, type=field.type)
    column = table.column(field.name).combine_chunks()
    return column if column.type == field.type else column.cast(field.type)


def _parquet(batches: Iterator[pa.RecordBatch], schema: pa.Schema = LIST_SCHEMA) -> bytes:
    sink = pa.BufferOutputStream()
    writer: pq.ParquetWriter | None = None
    for batch in batches:
        if writer is None:
            writer = pq.ParquetWriter(sink, batch.schema, compression="zstd")
        writer.write_batch(batch)
    if writer is None:  # a shard without rows: the bare schema
        writer = pq.ParquetWriter(sink, schema, compression="zstd")
    writer.close()
    return sink.getvalue().to_pybytes()


def _jsonl(batches: Iterator[pa.RecordBatch], schema: pa.Schema = LIST_SCHEMA) -> bytes:
    out = io.StringIO()
    for batch in batches:
        for row in batch.to_pylist():
            out.write(json.dumps(row) + "\n")
    return out.getvalue().encode("utf-8")


def dataset_card(manifest: Manifest, files: list[str]) -> str:
    """A short dataset card whose YAML config lets ``datasets.load_dataset`` find the files."""
    return front_matter(files) + "# Shardflow export\n\n" + columns_note(manifest)


def front_matter(files: list[str]) -> str:
    """The YAML block that tells ``datasets.load_dataset`` (and the Hub) where the files are."""
    entries = "\n".join(f"      - {f}" for f in files)
    return ("---\nconfigs:\n  - config_name: default\n    data_files:\n      - split: train\n"
            f"        path:\n{entries.replace('      -', '          -')}\n---\n\n")


def columns_note(manifest: Manifest) -> str:
    """What the exported files hold: the tokenizer, the columns, the totals."""
    signals = manifest.stats.get("signals") or {}
    meta = [f"`{c}`" for c in manifest.schema
            if c not in ("doc_id", "input_ids") and c not in signals]
    also = f"; metadata: {', '.join(meta)}" if meta else ""
    if signals:
        typed = [f"`{c}` ({v.get('type')})" for c, v in signals.items()]
        also += f"; signals: {', '.join(typed)}"
    return (
        f"Token ids of `{manifest.tokenizer.name}` (vocab {manifest.vocab_size}, EOS id "
        f"{manifest.eos_id}), one row per document: `doc_id`, `input_ids` (list of int32){also}.\n"
        f"{manifest.total_rows:,} documents, {manifest.total_tokens:,} tokens.\n")


def export(store: ReplicaSet, output: str, fmt: str,
           storage_options: dict[str, Any] | None = None, *, log: TextIO | None = None,
           progress: bool = True) -> ExportSummary:
    """Export the dataset's current version to ``output`` in format ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    manifest = store.read_manifest()  # pinned: the version read here is the one exported
    encoding = manifest.schema["input_ids"]
    out = resolve(output, storage_options)
    write: Callable[[Iterator[pa.RecordBatch], pa.Schema], bytes] = (
        _jsonl if fmt == "jsonl" else _parquet)
    suffix = "jsonl" if fmt == "jsonl" else "parquet"
    prefix = "data/" if fmt == "hf" else ""
    shards = shards_of(store, manifest)  # v2: from its index, verified
    # a view: its source's shards, beside it, and its masks (storage.format.view)
    data_store = source_store(store, manifest)
    masks = read_masks(store, manifest) if manifest.view is not None else None
    first = 0
    algorithm = _digest(manifest)
    bar = ProgressBar(len(shards), label="shards", enabled=progress, stream=log)
    names: list[str] = []
    schema: pa.Schema | None = None  # every part's: fixed by the first shard and the manifest
    for i, shard in enumerate(shards):
        names.append(f"{prefix}part-{i:05d}.{suffix}")
        data = _read(data_store, shard)
        keep = None
        if masks is not None:
            keep = [masks.group(first + g) for g in range(len(shard.row_groups))]
            shard = physical_shard(shard, masks, first)
        first += len(shard.row_groups)
        _check(shard, data, algorithm, encoding)
        if schema is None:
            schema = export_schema(manifest, pq.ParquetFile(io.BytesIO(data)).schema_arrow)
        try:
            batches = list_batches(data, encoding, schema, keep)
            write_atomic(out, names[-1], write(batches, schema))
        except (ManifestError, pa.ArrowInvalid) as exc:
            raise ManifestError(f"{shard.path}: {exc}") from exc
        bar.update(1, shard.tokens)
    extra = 0
    if fmt == "hf":  # the version's dataset card, pictures beside it, with the Hub's YAML
        from pipeline.output import card  # imported late: matplotlib, when installed

        built = card.build(store, manifest, report=card.read_report(store, manifest))
        for name in built.pictures:
            write_atomic(out, name, built.files[name])
        readme = (front_matter(names) + built.files[card.README].decode("utf-8")
                  + "\n## This export\n\n" + columns_note(manifest))
        write_atomic(out, "README.md", readme.encode("utf-8"))
        extra = 1 + len(built.pictures)
    return ExportSummary(out.url, len(names) + extra, manifest.total_rows,
                         manifest.total_tokens)


def _read(store: ReplicaSet, shard: ShardInfo) -> bytes:
    return store.get(shard.path, sha256=shard.sha256)


def _digest(manifest: Manifest) -> str:
    """The row groups' digest algorithm, chosen as ``storage verify`` chooses it."""
    algorithm = (manifest.index.digest if manifest.index is not None
                 else digest_algorithm(manifest.shards) if manifest.shards else SHA256)
    return algorithm if algorithm in (PIECE_DIGEST, SHA256) else SHA256


class _BytesFiles:
    """The two calls :func:`check_object` makes of a filesystem (``info``, ``cat_file``),
    answered from one object's bytes in memory."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def info(self, path: str) -> dict[str, Any]:
        return {"name": path, "size": len(self.data), "type": "file"}

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        return self.data[start:end]


def _check(shard: ShardInfo, data: bytes, algorithm: str, encoding: str) -> None:
    """``storage verify``'s checks of one shard, on its bytes; ``ManifestError`` naming the
    shard and what disagrees when it fails them."""
    loc = Location(f"memory://{shard.path}", _BytesFiles(data), "")
    finding = check_object(loc, shard.path, shard.bytes, shard.sha256, shard, algorithm,
                           encoding)
    if finding is not None:
        raise ManifestError(f"{shard.path}: {finding.kind}: {finding.detail} (the dataset "
                            "fails `python -m storage verify`; nothing of this shard was "
                            "exported)")
