"""Build a view: read a dataset's selection columns, decide per document, write the masks.

``select(SRC, where, DST)`` reads, for every row group of SRC's current version, only the
columns the expression names (their byte ranges, under the shard's footer verified against the
index), evaluates the expression, ANDs it with SRC's own masks when SRC is a view, and writes
DST: its keep-masks, a copy of SRC's index with the kept rows and tokens, and a manifest whose
``view`` record names the original source (a view of a view points at the original shards).

The one thing the signal columns cannot give is a kept document's token count, which the
loader's sample plan needs: a row group kept whole or dropped whole needs none (its tokens are
the source's, or 0); for a row group kept in part, the value lengths of its ``input_ids``
chunk are read (fetched, checked against the index's digest, decoded to count, never kept or
written). A shard records no per-document token count that would spare it.

Before DST's manifest is committed, a pin goes into the source (:mod:`storage.admin.view_pins`)
so the source's ``gc`` never removes what the view names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import posixpath
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.driver.progress import ProgressBar
from pipeline.select.expression import TOKEN_COLUMN, Selection, parse
from storage import (
    ChecksumMismatchError,
    Manifest,
    ReplicaError,
    ReplicaSet,
    shards_of,
    tokens,
)
from storage.admin.versions import commit
from storage.admin.view_pins import write_pin
from storage.format.checksums import PIECE_DIGEST, digest_bytes, piece_key, piece_matches
from storage.format.index import (
    GROUP_COLUMNS,
    OPTIONAL_SHARD_COLUMNS,
    SHARD_COLUMNS,
    encode_columns,
)
from storage.format.layout import doclens_name, masks_name
from storage.format.manifest import ShardInfo, Totals
from storage.format.view import (
    Masks,
    ViewRef,
    decode_lengths,
    encode_lengths,
    encode_masks,
    kept_counts,
)
from storage.io.index_store import fetch_columns
from storage.io.replicas.leases import hold_replicas
from storage.io.view_store import read_masks, sibling, source_store

#: Arrow types of the manifest's schema names that ``pa.type_for_alias`` does not know
_TYPES = {"bool": pa.bool_(), "float": pa.float32(), "double": pa.float64()}


@dataclass
class SelectSummary:
    output: str
    where: str
    documents: int
    of_documents: int
    tokens: int
    of_tokens: int
    own_bytes: int
    source_bytes: int
    #: row groups the view keeps something of, and of those, the ones it keeps only part of
    #: (each read and decoded whole for that part)
    read_groups: int = 0
    split_groups: int = 0

    def render(self) -> str:
        share = self.documents / self.of_documents if self.of_documents else 0.0
        own = self.own_bytes / self.source_bytes if self.source_bytes else 0.0
        out = (f"selected {self.documents:,} of {self.of_documents:,} documents ({share:.1%}), "
               f"{self.tokens:,} of {self.of_tokens:,} tokens, where {self.where}\n"
               f"view {self.output}: {self.own_bytes:,} bytes of its own ({own:.3%} of the "
               f"source's {self.source_bytes:,}); no token copied\n"
               f"reads {self.read_groups:,} row groups, {self.split_groups:,} of them split")
        if self.split_groups > max(1, self.read_groups // 4):
            out += ("\nnote: the documents it keeps are spread over the source's row groups, "
                    "and its loader decodes each of those whole for the part it keeps; a "
                    "source written with `pipeline run --cluster-by COLUMN`, on a column the "
                    "view selects on, keeps whole row groups instead")
        return out


def arrow_schema(manifest: Manifest) -> dict[str, pa.DataType]:
    """The manifest's columns as Arrow types (``input_ids`` aside: never selected on)."""
    out: dict[str, pa.DataType] = {}
    for name, kind in manifest.schema.items():
        if name == TOKEN_COLUMN:
            out[name] = pa.binary()
            continue
        try:
            out[name] = _TYPES.get(kind) or pa.type_for_alias(kind)
        except ValueError:
            out[name] = pa.string()
    return out


def manifest_sha256(manifest: Manifest) -> str:
    """The sha256 of a manifest's canonical JSON (what ``_versions/`` records are named by)."""
    return digest_bytes(manifest.to_json().encode("utf-8"))


@dataclass
class _Group:
    keep: np.ndarray
    lengths: np.ndarray | None


#: holes up to this between the byte ranges one shard needs are read through (one request)
HOLE_BYTES = 64 << 10
#: row groups whose token counts are decoded at once (~8 MB of tokens at the default sizes)
LENGTH_BATCH = 16


def _sparse(size: int) -> mmap.mmap:
    """A shard-sized anonymous mapping, pages made only where fetched ranges are placed."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    return mmap.mmap(-1, max(1, size), flags=flags)


def _coalesce(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo - out[-1][1] <= HOLE_BYTES:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


class _ShardReader:
    """One shard's selection columns (and, where needed, its documents' token counts): the
    byte ranges fetched into a shard-sized sparse buffer, decoded by one Parquet reader under
    the shard's footer (verified against the index) for all the shard's row groups at once."""

    def __init__(self, data: ReplicaSet, shard: ShardInfo, algorithm: str,
                 encoding: str) -> None:
        self.data, self.shard, self.algorithm, self.encoding = data, shard, algorithm, encoding
        footer = data.get(shard.path, sha256=shard.footer_sha256,
                          start=shard.bytes - shard.footer_length, end=shard.bytes)
        self.meta = tokens.parse_footer(footer)
        self.present = set(self.meta.schema.names)
        self.buf = _sparse(shard.bytes)
        #: 1 when this shard's token counts came from the source's cache, not decoded
        self.cache_hits = 0
        self.file = pq.ParquetFile(pa.BufferReader(pa.py_buffer(self.buf)), metadata=self.meta)

    def _fetch(self, spans: list[tuple[int, int]]) -> None:
        for lo, hi in _coalesce(spans):
            self.buf[lo:hi] = self.data.get(self.shard.path, start=lo, end=hi)

    def _split(self, table: pa.Table, groups: list[int]) -> list[pa.Table]:
        out, at = [], 0
        for g in groups:
            n = self.meta.row_group(g).num_rows
            out.append(table.slice(at, n))
            at += n
        return out

    def columns(self, groups: list[int], names: Sequence[str]) -> list[pa.Table]:
        """The ``names`` columns of each of ``groups`` (nulls for a column the shard lacks)."""
        have = [c for c in names if c in self.present]
        if not have:
            return [pa.table({"_": pa.nulls(self.meta.row_group(g).num_rows)}) for g in groups]
        self._fetch([tokens.chunk_range(self.meta, g, c) for g in groups for c in have])
        table = self.file.read_row_groups(groups, columns=have, use_threads=False)
        for c in names:  # a shard without a column: nulls (never kept by a comparison)
            if c not in table.column_names:
                table = table.append_column(c, pa.nulls(table.num_rows))
        return self._split(table, groups)

    def lengths(self, groups: list[int], group_tokens: np.ndarray) -> list[np.ndarray]:
        """Token count of each document of each of ``groups``: from the shard's cache in the
        source (``_doclens/``, checked against ``group_tokens``: the index's tokens of each
        of the shard's row groups) when a select made it before; else every row group's
        ``input_ids`` chunk fetched, checked against the index's digest, decoded to count,
        and the counts cached for the next select."""
        if not groups:
            return []
        rows = np.array([self.meta.row_group(g).num_rows
                         for g in range(self.meta.num_row_groups)], dtype=np.int64)
        path = doclens_name(self.shard.path)
        try:
            cached = decode_lengths(self.data.get(path), rows, group_tokens)
        except FileNotFoundError:
            cached = None
        if cached is None:
            cached = self._decode_lengths(list(range(self.meta.num_row_groups)))
            # a cache: a store that refuses it costs the next select time, nothing else
            with contextlib.suppress(OSError, ReplicaError):
                self.data.put(path, encode_lengths(np.concatenate(cached) if cached
                                                   else np.zeros(0, np.int64)))
        else:
            self.cache_hits += 1
        return [cached[g] for g in groups]

    def _decode_lengths(self, groups: list[int]) -> list[np.ndarray]:
        """Each group's documents' token counts, :data:`LENGTH_BATCH` row groups a decode:
        their token chunks fetched into the sparse buffer, verified, decoded, and their pages
        given back, so a shard of any size holds a batch's tokens at a time."""
        out: list[np.ndarray] = []
        for at in range(0, len(groups), LENGTH_BATCH):
            batch = groups[at:at + LENGTH_BATCH]
            pieces = []
            for g in batch:
                info = self.shard.row_groups[g]
                digest = info.blake3 if self.algorithm == PIECE_DIGEST else info.sha256
                pieces.append((info.offset, info.offset + info.length,
                               piece_key(digest, self.algorithm)))
            self._fetch([(lo, hi) for lo, hi, _ in pieces])
            view = memoryview(self.buf)
            for lo, hi, key in pieces:
                if not piece_matches(key, view[lo:hi]):
                    raise ChecksumMismatchError(f"{self.shard.path}[{lo}:{hi}] does not match "
                                                "its checksum in the index")
            del view
            column = self.file.read_row_groups(batch, columns=[TOKEN_COLUMN],
                                               use_threads=False).column(0)
            lens = np.concatenate([tokens.lengths(chunk, self.encoding)
                                   for chunk in column.chunks] or [np.zeros(0, np.int64)])
            bounds = np.cumsum([0] + [self.meta.row_group(g).num_rows for g in batch])
            out += [lens[a:b].astype(np.int64)
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            del column
            lo = min(p[0] for p in pieces)
            lo -= lo % mmap.PAGESIZE
            self.buf.madvise(mmap.MADV_DONTNEED, lo, max(p[1] for p in pieces) - lo)
        return out


def _select_shard(data: ReplicaSet, shard: ShardInfo, first: int, selection: Selection,
                  base: Masks | None, rows: np.ndarray, toks: np.ndarray, algorithm: str,
                  encoding: str) -> list[_Group]:
    reader = _ShardReader(data, shard, algorithm, encoding)
    n_groups = len(shard.row_groups)
    keeps = [base.group(first + g) if base is not None
             else np.ones(int(rows[first + g]), dtype=bool) for g in range(n_groups)]
    for g, keep in enumerate(keeps):
        if reader.meta.row_group(g).num_rows != len(keep):
            raise ChecksumMismatchError(f"{shard.path} row group {g}: "
                                        f"{reader.meta.row_group(g).num_rows} rows, the index "
                                        f"says {len(keep)}")
    todo = [g for g in range(n_groups) if keeps[g].any()]
    for g, table in zip(todo, reader.columns(todo, selection.columns), strict=True):
        keeps[g] &= selection.keep(table).to_numpy(zero_copy_only=False)
    partial = [g for g in range(n_groups) if 0 < int(keeps[g].sum()) < len(keeps[g])]
    lengths: list[np.ndarray | None] = [None] * n_groups
    tokens_of = toks[first:first + n_groups]
    for g, lens in zip(partial, reader.lengths(partial, tokens_of), strict=True):
        lengths[g] = lens
    return [_Group(keeps[g], lengths[g]) for g in range(n_groups)]


def select(src: ReplicaSet, where: str, dst: ReplicaSet, *, log: TextIO | None = None,
           progress: bool = True, threads: int = 8, card: bool = True) -> SelectSummary:
    """Make ``dst`` the view of ``src``'s current version that keeps the documents for which
    ``where`` is true (see the module docstring); returns what it kept. With ``card``, the
    view's dataset card is written before its commit, as a run writes its own: a view is a
    dataset people train on, and its card shows what the expression kept."""
    m = src.read_manifest()  # pinned: the version read here is the one selected from
    if m.index is None:
        raise ValueError(f"{src.url} is a shardflow.dataset/1 dataset: run `python -m storage "
                         "upgrade` on it first (a view copies its binary index)")
    selection = parse(where, arrow_schema(m))
    if m.view is None:
        origin, data, base = src, src, None
        name = posixpath.basename(src.primary.root.rstrip("/"))
        version, text = manifest_sha256(m), selection.sql
    else:  # a view of a view: the original source, the masks ANDed
        data = source_store(src, m)
        origin, base, name = data, read_masks(src, m), m.view.source
        version, text = m.view.source_version, f"({m.view.where}) AND ({selection.sql})"
    _check_beside(dst, origin, name)
    _check_output(dst, name)
    cols = fetch_columns(src, m.index, list({**GROUP_COLUMNS, **SHARD_COLUMNS}),
                         optional=list(OPTIONAL_SHARD_COLUMNS))
    shards = shards_of(src, m)
    first = cols["first_group"].astype(np.int64)
    rows = (base.source_rows if base is not None else cols["rows"]).astype(np.int64)
    toks = (base.source_tokens if base is not None else cols["tokens"]).astype(np.int64)
    algorithm, encoding = m.index.digest, m.schema.get(TOKEN_COLUMN, tokens.LEGACY_LIST)
    bar = ProgressBar(len(shards), label="shards", enabled=progress, stream=log)
    groups: list[_Group] = []

    def one(s: int) -> list[_Group]:
        return _select_shard(data, shards[s], int(first[s]), selection, base, rows, toks,
                             algorithm, encoding)

    with ThreadPoolExecutor(max(1, min(threads, len(shards)))) as pool:
        for part in pool.map(one, range(len(shards))):
            groups += part
            bar.update(1, sum(len(g.keep) for g in part))
    masks_data = encode_masks(rows, toks, [g.keep for g in groups])
    masks = Masks(masks_data)
    kept_rows, kept_tokens = kept_counts(masks, [g.lengths for g in groups])
    view_cols = dict(cols)
    view_cols["rows"], view_cols["tokens"] = kept_rows, kept_tokens
    view_cols["shard_rows"] = np.add.reduceat(kept_rows, first[:-1]) if len(rows) else \
        np.zeros(0, dtype=np.int64)
    view_cols["shard_tokens"] = np.add.reduceat(kept_tokens, first[:-1]) if len(rows) else \
        np.zeros(0, dtype=np.int64)
    index_data, ref = encode_columns(view_cols, algorithm)
    masks_path = masks_name(digest_bytes(masks_data))
    counts = m.counts
    view = ViewRef(name, version, text, masks_path, len(masks_data), digest_bytes(masks_data),
                   int(rows.sum()), int(toks.sum()))
    stats = {k: v for k, v in m.stats.items() if k == "signals"}
    # the source's lineage says how its documents were made, and stays; its drop records and
    # reports are objects of the source's folder, not the view's
    manifest = dataclasses.replace(
        m, index=ref, quarantine=(), drops=None, reports=(), stats=stats, view=view,
        totals=Totals(counts.shards, counts.row_groups, int(kept_rows.sum()),
                      int(kept_tokens.sum()), counts.bytes))
    lease = hold_replicas(dst, "select")
    try:
        write_pin(origin, posixpath.basename(dst.primary.root.rstrip("/")), version)
        dst.put(masks_path, masks_data)
        dst.put(ref.path, index_data)
        if card:  # before the swap, like every object of the version (keyed by its manifest)
            from pipeline.output.card import write_at_commit  # imported late: matplotlib

            write_at_commit(dst, manifest, log if log is not None else sys.stderr)
        commit(dst, manifest, log)
    finally:
        lease.release()
    return SelectSummary(dst.url, text, int(kept_rows.sum()), int(rows.sum()),
                         int(kept_tokens.sum()), int(toks.sum()),
                         len(masks_data) + len(index_data) + len(manifest.to_json()),
                         counts.bytes, int((kept_rows > 0).sum()),
                         int(((kept_rows > 0) & (kept_rows < rows)).sum()))


def view_replicas(src: ReplicaSet, output: str,
                  storage_options: dict[str, Any] | None = None) -> ReplicaSet:
    """The view's replica set: ``output``, and beside each other replica of ``src`` a folder
    of the same name (every replica of a view reads the source beside it)."""
    first = ReplicaSet.from_urls([output], storage_options).replicas[0].loc
    name = posixpath.basename(first.root.rstrip("/"))
    return ReplicaSet([first, *(sibling(r.loc, name) for r in src.replicas[1:])])


def _check_output(dst: ReplicaSet, name: str) -> None:
    """``select`` writes a view's next version, never over a dataset of shards (its gc would
    then remove them) or a view of another source."""
    try:
        existing = dst.read_manifest()
    except FileNotFoundError:
        return
    if existing.view is None or existing.view.source != name:
        what = "a dataset of its own shards" if existing.view is None else \
            f"a view of {existing.view.source!r}"
        raise ValueError(f"--output {dst.url} holds {what}; a select writes only a new version "
                         f"of a view of {name!r} there: choose another folder")


def _check_beside(dst: ReplicaSet, origin: ReplicaSet, name: str) -> None:
    """A view lives beside its source (same parent folder on every replica): that is how its
    readers find the source without a manifest naming any other place."""
    for view_replica, source_replica in zip(dst.replicas, origin.replicas, strict=False):
        want = source_replica.loc.root.rstrip("/")
        try:
            got = sibling(view_replica.loc, name).root.rstrip("/")
        except ValueError as exc:
            raise ValueError(f"--output: {exc}") from None
        if got != want:
            raise ValueError(f"--output {view_replica.loc.url}: a view lives beside its source "
                             f"(in the folder that holds {source_replica.loc.url}), so its "
                             f"readers find the source as its sibling {name!r}")
        if view_replica.loc.root.rstrip("/") == want:
            raise ValueError("--output is the source itself")
    if len(dst.replicas) > len(origin.replicas):
        raise ValueError(f"--output has {len(dst.replicas)} replicas, the source "
                         f"{len(origin.replicas)}: each replica of a view reads the source "
                         "beside it")
