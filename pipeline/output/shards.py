"""Write one Parquet feature shard: token ids per document, row groups sized by tokens, zstd
(or LZ4 or no compression: ``--shard-compression``, :data:`SHARD_CODECS`).

How ids are encoded in ``input_ids`` (little-endian uint16/uint32 in one binary value per
document) is the storage format's business: :mod:`storage.tokens`.

A shard is written a row group at a time (:class:`ShardWriter`) into a temporary file, and put
with one atomic put, so a crashed worker never leaves a half-written object under a final name,
and its checksum is known before the upload. Only the row group being filled is in memory
while documents arrive; the finished shard's bytes once, for the put.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from cyclopts import Parameter

from pipeline.config_field import flag
from pipeline.planning.plan import close_at_target
from storage import RowGroupInfo, ShardInfo, digest_bytes, tokens
from storage.format.checksums import piece_digest
from storage.format.chunk_footer import footerless_codec

SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("input_ids", pa.binary(), nullable=False),
])
#: web inputs (pipeline.web): metadata columns after ``input_ids`` for inspection and export;
#: readers of tokens never read them (they fetch the ``input_ids`` column chunk only)
META_FIELDS = (pa.field("url", pa.string()), pa.field("date", pa.string()),
               pa.field("source", pa.string()), pa.field("lang", pa.string()),
               pa.field("lang_score", pa.float32()))
META_SCHEMA = pa.schema([*SCHEMA, *META_FIELDS])
META_NAMES = frozenset(f.name for f in META_FIELDS)
#: ids of vocabularies up to 65,536 entries (GPT-2's is 50,257)
GPT2_DTYPE = np.dtype("<u2")
#: the shard codecs (``--shard-compression``, pyarrow's names; "lz4" is written as LZ4_RAW)
#: and the level each is written at. zstd: the smallest shards; lz4 and none: less of the
#: loader's CPU per token (docs/loader.md, "Footers made from the index").
SHARD_CODECS: dict[str, int | None] = {"zstd": 3, "lz4": None, "none": None}
DEFAULT_CODEC = "zstd"
#: a column chunk's codec as its Parquet metadata names it -> :data:`SHARD_CODECS`' name
_CODEC_OF_METADATA = {"ZSTD": "zstd", "LZ4": "lz4", "LZ4_RAW": "lz4", "UNCOMPRESSED": "none"}


def check_codec(codec: str) -> str:
    """``codec`` if it is one of :data:`SHARD_CODECS`, else a ValueError naming them."""
    if codec not in SHARD_CODECS:
        raise ValueError(f"shard compression must be one of {', '.join(SHARD_CODECS)}, "
                         f"not {codec!r}")
    return codec


@dataclass
class ShardFlags:
    """How the feature shards are laid out, as ``pipeline run`` flags."""

    row_group_tokens: int = flag(256 * 1024, "tokens per Parquet row group (the loader's unit "
                                 "of reading)")
    # recorded in the manifest when not zstd (PipelineConfig.for_manifest): other manifests
    # keep their bytes
    shard_compression: Annotated[str, Parameter(metavar="CODEC")] = flag(
        DEFAULT_CODEC, "the shards' Parquet codec: 'zstd' (smallest), 'lz4' or 'none' (larger "
        "shards, less of the loader's CPU per token)", manifest=False)
    # recorded in the manifest when set (PipelineConfig.for_manifest), like the codec
    cluster_by: Annotated[str, Parameter(metavar="COLUMN")] = flag(
        "", "order each shard's documents by this column, ascending (a step's signal such as "
        "'quality.score', or 'lang'), so that a view selecting on it keeps and leaves out "
        "whole row groups and its loader decodes only what it keeps "
        "(pipeline/output/cluster.py)", manifest=False)

    def check_shards(self) -> None:
        check_codec(self.shard_compression)


def shard_codec(meta: pq.FileMetaData) -> str:
    """The codec (:data:`SHARD_CODECS`' name) a shard's ``input_ids`` column was written
    with, from its Parquet metadata; zstd for a shard without row groups."""
    if not meta.num_row_groups:
        return DEFAULT_CODEC
    name = meta.row_group(0).column(SCHEMA.get_field_index("input_ids")).compression
    if name not in _CODEC_OF_METADATA:
        raise ValueError(f"shard written with codec {name}, not one of "
                         f"{', '.join(SHARD_CODECS)}")
    return _CODEC_OF_METADATA[name]


def schema_description(dtype: np.dtype, metadata: bool = False,
                       signals: dict[str, str] | None = None) -> dict[str, str]:
    """The manifest's ``schema``: column names to their types / token encodings (the steps'
    signal columns last)."""
    out = {"doc_id": "string", "input_ids": tokens.encoding_name(dtype)}
    if metadata:
        out.update({f.name: str(f.type) for f in META_FIELDS})
    out.update(signals or {})
    return out


def row_group_bounds(token_counts: Sequence[int], target_tokens: int) -> list[tuple[int, int]]:
    """Split documents into consecutive row groups of about ``target_tokens`` tokens each."""
    return close_at_target(token_counts, target_tokens)


def token_column(ids: Sequence[np.ndarray], dtype: np.dtype) -> pa.BinaryArray:
    """The ``input_ids`` column of documents given as one array of ids each."""
    lengths = np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids))
    values = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    return tokens.pack(lengths, values, dtype)


def shard_table(doc_ids: Sequence[str] | pa.Array, input_ids: pa.BinaryArray,
                columns: dict[str, Any] | None = None) -> pa.Table:
    """A shard's rows. ``columns``: the web metadata columns (:data:`META_FIELDS`, lists by
    name) when ``url`` is among them, and the steps' signal columns (Arrow arrays named
    ``<step>.<signal>``), which follow in their order."""
    ids = doc_ids if isinstance(doc_ids, pa.Array) else pa.array(list(doc_ids), pa.string())
    if not columns:
        return pa.Table.from_arrays([ids, input_ids], schema=SCHEMA)
    meta = "url" in columns
    arrays = [ids, input_ids]
    fields = list(SCHEMA)
    if meta:
        arrays += [pa.array(columns[f.name], f.type) for f in META_FIELDS]
        fields += META_FIELDS
    for name, values in columns.items():
        if meta and name in META_NAMES:
            continue
        arrays.append(values)
        fields.append(pa.field(name, values.type))
    schema = META_SCHEMA if len(fields) == len(META_SCHEMA) and meta else pa.schema(fields)
    return pa.Table.from_arrays(arrays, schema=schema)


def shard_schema(read: pa.Schema) -> pa.Schema:
    """The schema a shard was written with, from the one Parquet gives back on reading it
    (phase 2 writes a shard again without its duplicates, with the same columns)."""
    names = read.names
    fields = list(SCHEMA)
    if "url" in names:
        fields += META_FIELDS
    known = {f.name for f in fields}
    fields += [pa.field(n, read.field(n).type) for n in names if n not in known]
    if len(fields) == len(SCHEMA):
        return SCHEMA
    if len(fields) == len(META_SCHEMA) and "url" in names:
        return META_SCHEMA
    return pa.schema(fields)


class ShardWriter:
    """One shard written a row group at a time, so that only the row group being filled is in
    memory, never the shard's rows.

    Documents go in as tables (:func:`add`) in order; a row group is written as soon as its
    documents reach ``target_rg_tokens`` tokens (:func:`row_group_bounds` on the prefix, so
    the boundaries, and the bytes, are those of encoding all rows at once). The Parquet bytes
    gather in a temporary file, read back once by :func:`finish` for the one atomic put.
    """

    def __init__(self, dtype: np.dtype, target_rg_tokens: int,
                 schema: pa.Schema | None = SCHEMA, compression: str = DEFAULT_CODEC) -> None:
        """``schema``: ``None`` takes the first table's (a shard whose signal columns are
        known only once its first batch is)."""
        self.dtype, self.target = np.dtype(dtype), target_rg_tokens
        self.encoding = tokens.encoding_name(self.dtype)
        self.compression = check_codec(compression)
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by finish/close
        self._writer: pq.ParquetWriter | None = None
        if schema is not None:
            self._open(schema)
        self._pending: list[pa.Table] = []
        self._counts = np.zeros(0, dtype=np.int64)
        #: (rows, tokens) of each row group written
        self.groups: list[tuple[int, int]] = []

    def _open(self, schema: pa.Schema) -> None:
        # Token ids are stored plain (no dictionary: it buys nothing after zstd and costs a
        # decode step); pages of 1 MiB keep decoding in large runs.
        self._writer = pq.ParquetWriter(self._file, schema, compression=self.compression,
                                        compression_level=SHARD_CODECS[self.compression],
                                        use_dictionary=["doc_id", "lang"],
                                        data_page_size=1 << 20, write_statistics=False,
                                        store_schema=False)

    @property
    def rows(self) -> int:
        return sum(r for r, _ in self.groups) + len(self._counts)

    def add(self, table: pa.Table, counts: np.ndarray | None = None) -> None:
        """Append documents (``counts``: their tokens, computed from the table if not given)."""
        if not table.num_rows:
            return
        if self._writer is None:
            self._open(table.schema)
        if counts is None:
            counts = tokens.lengths(table.column("input_ids"), self.encoding)
        self._pending.append(table)
        self._counts = np.concatenate([self._counts, np.asarray(counts, dtype=np.int64)])
        ends = np.cumsum(self._counts)
        if not len(ends) or ends[-1] < self.target:
            return
        # Close groups exactly where close_at_target would: each ends at the first document
        # that brings its own total to the target.
        rows = pa.concat_tables(self._pending).combine_chunks()
        lo = 0
        while lo < len(ends):
            base = int(ends[lo - 1]) if lo else 0
            hi = int(np.searchsorted(ends, base + self.target, side="left")) + 1
            if hi > len(ends):
                break
            self._write(rows.slice(lo, hi - lo), int(ends[hi - 1]) - base)
            lo = hi
        rest = rows.slice(lo)
        self._pending = [rest] if rest.num_rows else []
        self._counts = self._counts[lo:]

    def _write(self, table: pa.Table, n_tokens: int) -> None:
        assert self._writer is not None
        self._writer.write_table(table, row_group_size=table.num_rows)
        self.groups.append((table.num_rows, n_tokens))

    def finish(self, path: str = "shard.parquet") -> tuple[bytes, ShardInfo]:
        """The shard's bytes and manifest entry (the last row group may be under target)."""
        if self._counts.size:
            self._write(pa.concat_tables(self._pending).combine_chunks(),
                        int(self._counts.sum()))
        self._pending, self._counts = [], np.zeros(0, dtype=np.int64)
        if self._writer is None:  # no rows: an empty shard of the plain schema
            self._open(SCHEMA)
        assert self._writer is not None
        self._writer.close()
        with self._file:
            self._file.seek(0)
            data = self._file.read()
        return data, _describe(data, self.groups, path)

    def close(self) -> None:
        """Drop an unfinished shard (its temporary file goes with it)."""
        with contextlib.suppress(Exception):
            if self._writer is not None:
                self._writer.close()
        self._file.close()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _describe(data: bytes, groups: list[tuple[int, int]], path: str) -> ShardInfo:
    """The manifest entry of a shard's bytes: each row group's ``input_ids`` column chunk
    (offset, length, digest), the footer, the whole file's checksum, and the chunks' codec
    (a reader then decodes them without fetching the footer)."""
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    infos = []
    for i, (rows, n_tokens) in enumerate(groups):
        start, end = tokens.chunk_range(meta, i)
        length = end - start
        piece = memoryview(data)[start:end]
        infos.append(RowGroupInfo(rows=rows, tokens=n_tokens, offset=start, length=length,
                                  blake3=piece_digest(piece)))
    footer_length = meta.serialized_size + 8
    return ShardInfo(path=path, rows=sum(r for r, _ in groups),
                     tokens=sum(t for _, t in groups), bytes=len(data),
                     sha256=digest_bytes(data), row_groups=tuple(infos),
                     footer_length=footer_length,
                     footer_sha256=digest_bytes(data[len(data) - footer_length:]),
                     codec=footerless_codec(meta))


def encode_table(table: pa.Table, dtype: np.dtype, target_rg_tokens: int,
                 path: str = "shard.parquet",
                 compression: str = DEFAULT_CODEC) -> tuple[bytes, ShardInfo]:
    """The Parquet bytes of one shard and its manifest entry (:class:`ShardWriter` at once).

    The entry locates each row group's ``input_ids`` column chunk (offset, length, sha256) and
    the footer, so that a reader fetches and verifies exactly what it decodes. Rows are made
    contiguous per row group: the bytes depend on the rows only, not on how they were chunked.
    """
    with ShardWriter(dtype, target_rg_tokens, compression=compression) as writer:
        writer.add(table)
        return writer.finish(path)


def encode_shard(doc_ids: Sequence[str], ids: Sequence[np.ndarray], target_rg_tokens: int,
                 path: str = "shard.parquet", dtype: np.dtype = GPT2_DTYPE,
                 compression: str = DEFAULT_CODEC) -> tuple[bytes, ShardInfo]:
    """:func:`encode_table` for documents given as one array of token ids each."""
    return encode_table(shard_table(doc_ids, token_column(ids, dtype)), dtype,
                        target_rg_tokens, path, compression)
