"""The binary row-group index: per-row-group metadata as columns in one object.

A dataset of a million row groups would need ~150 MB of ``manifest.json`` to list them; the
index holds the same facts in 36 bytes per row group (``rows`` u4, ``tokens`` u4, ``offset``
u8, ``length`` u4, ``digest``: the first 16 bytes of the token column chunk's BLAKE3, or of its
SHA-256 in datasets written before, as the manifest's ``index.digest`` says), plus
one small record per shard, and a reader fetches only the columns it needs with ranged reads.

Layout (all little-endian)::

    b"SFIDX\\x01\\0\\0"  u8 header length  header (JSON)  columns, each 64-byte aligned

The header names each column's dtype, offset, byte length and sha256 (hex), so every column
read alone is verified; the manifest records the sha256 of the whole object and of the header
(``IndexRef``), so the header, hence every column, is anchored in the manifest.

On the store (``shardflow.dataset/2``), the object is ``index/<sha16>.sfidx`` (content-addressed,
like the shards: a committed version's index never changes). :func:`encode` builds it and its
reference, :func:`with_index` makes the v2 manifest that names it; writing and reading it on the
store (``write_index``, ``fetch_columns``, ``shards_of``) is :mod:`storage.io.index_store`.

Group columns: ``rows``, ``tokens``, ``offset``, ``length``, ``digest`` (16 bytes: a truncated
BLAKE3 or SHA-256, :mod:`storage.format.checksums`, keeps the audit property at 128 bits).
Shard columns: ``first_group`` (S+1),
``shard_rows``, ``shard_tokens``, ``shard_bytes``, ``shard_sha256`` (32 bytes),
``footer_length``, ``footer_sha256`` (32 bytes), ``path_end`` (S+1) and ``paths`` (the
shard paths, UTF-8, concatenated); optional (absent from indexes written before it, which
readers still take): ``shard_codec`` (u1: the Parquet codec of the shard's ``input_ids``
chunks when a reader may decode them without the footer, :mod:`storage.format.chunk_footer`;
255 for a shard whose footer must be read).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

import numpy as np

from storage.format.checksums import PIECE_DIGEST, SHA256
from storage.format.chunk_footer import CODECS, NO_CODEC
from storage.format.layout import UnsafePathError, index_name, safe_relative
from storage.format.manifest import (
    FORMAT_V2,
    IndexRef,
    Manifest,
    ManifestError,
    RowGroupInfo,
    ShardInfo,
    Totals,
)

MAGIC = b"SFIDX\x01\x00\x00"
FORMAT = "shardflow.index/1"
DIGEST_BYTES = 16
ALIGN = 64

GROUP_COLUMNS = {"rows": "<u4", "tokens": "<u4", "offset": "<u8", "length": "<u4",
                 "digest": f"V{DIGEST_BYTES}"}
SHARD_COLUMNS = {"first_group": "<u8", "shard_rows": "<u8", "shard_tokens": "<u8",
                 "shard_bytes": "<u8", "shard_sha256": "V32", "footer_length": "<u8",
                 "footer_sha256": "V32", "path_end": "<u8", "paths": "u1"}
#: per-shard columns an index may lack (written since; a reader of an index without them
#: falls back to what they save it, e.g. the shard's footer)
OPTIONAL_SHARD_COLUMNS = {"shard_codec": "u1"}


class IndexFormatError(ValueError):
    """An index object that cannot be trusted (bad magic, header, or checksum)."""


def raw_digest(hex_digest: str, width: int) -> bytes:
    """A hex digest as the index stores it: its first ``width`` bytes, zero-padded."""
    return bytes.fromhex(hex_digest)[:width].ljust(width, b"\0")


def _raw_column(values: Sequence[bytes], width: int) -> np.ndarray:
    out = np.zeros(len(values), dtype=f"V{width}")
    if len(values):
        out[:] = np.frombuffer(b"".join(values), dtype=f"V{width}")
    return out


def _hex_to_bytes(values: Sequence[str], width: int) -> np.ndarray:
    return _raw_column([raw_digest(v, width) for v in values], width)


@dataclass(frozen=True)
class ShardFields:
    """The per-shard values of an index, in order (digests as raw bytes: :func:`raw_digest`)."""

    paths: list[bytes]
    group_counts: list[int]
    rows: list[int]
    tokens: list[int]
    bytes: list[int]
    sha256: list[bytes]
    footer_length: list[int]
    footer_sha256: list[bytes]
    codec: list[int]

    def columns(self) -> dict[str, np.ndarray]:
        """The index's per-shard columns (:data:`SHARD_COLUMNS` and ``shard_codec``)."""
        counts = np.array(self.group_counts, dtype=np.uint64)
        return {
            "first_group": np.concatenate([[0], np.cumsum(counts)]).astype(np.uint64),
            "shard_rows": np.array(self.rows, dtype=np.uint64),
            "shard_tokens": np.array(self.tokens, dtype=np.uint64),
            "shard_bytes": np.array(self.bytes, dtype=np.uint64),
            "shard_sha256": _raw_column(self.sha256, 32),
            "footer_length": np.array(self.footer_length, dtype=np.uint64),
            "footer_sha256": _raw_column(self.footer_sha256, 32),
            "path_end": np.concatenate([[0], np.cumsum([len(p) for p in self.paths])]
                                       ).astype(np.uint64),
            "paths": np.frombuffer(b"".join(self.paths), dtype=np.uint8),
            "shard_codec": np.array(self.codec, dtype=np.uint8),
        }


def digest_hex(column: np.ndarray, i: int) -> str:
    """Row ``i`` of a digest column as hex (32 chars for ``digest``, 64 for the sha256s)."""
    return bytes(column[i]).hex()


def column_dtypes(names: Sequence[str]) -> dict[str, str]:
    """The dtype of each column of an index with the columns ``names``: every one of
    ``GROUP_COLUMNS`` and ``SHARD_COLUMNS``, and any of ``OPTIONAL_SHARD_COLUMNS``."""
    want = {**GROUP_COLUMNS, **SHARD_COLUMNS}
    if not set(want) <= set(names) <= set(want) | set(OPTIONAL_SHARD_COLUMNS):
        raise ValueError(f"index columns {sorted(names)}, expected {sorted(want)} and any "
                         f"of {sorted(OPTIONAL_SHARD_COLUMNS)}")
    return {**want, **{k: v for k, v in OPTIONAL_SHARD_COLUMNS.items() if k in names}}


def padding(nbytes: int) -> bytes:
    """The zero bytes after ``nbytes`` of header or column, so the next starts aligned."""
    return b"\0" * (-nbytes % ALIGN)


def index_head(columns: dict[str, tuple[int, str]], n_groups: int, n_shards: int) -> bytes:
    """The object's bytes before its first column (magic, header length, header, padding),
    given each column's ``(byte length, sha256 hex)``: the columns follow in name order,
    each padded to :data:`ALIGN`. Writers that hold the columns (:func:`build_index_arrays`)
    and writers that spilled them (``pipeline.output.index_file``) make the same bytes with it."""
    dtypes = column_dtypes(list(columns))
    table, offset = {}, 0
    for name in sorted(dtypes):
        nbytes, sha256 = columns[name]
        table[name] = {"dtype": dtypes[name], "offset": offset, "bytes": nbytes,
                       "sha256": sha256}
        offset += nbytes + (-nbytes % ALIGN)
    header = json.dumps({"format": FORMAT, "row_groups": n_groups, "shards": n_shards,
                         "columns": table}, sort_keys=True).encode()
    head = MAGIC + np.uint64(len(header)).tobytes() + header
    return head + padding(len(head))


def build_index_arrays(columns: dict[str, np.ndarray]) -> bytes:
    """The index object from its columns (names and dtypes of :func:`column_dtypes`).
    Deterministic: the same columns give the same bytes."""
    dtypes = column_dtypes(list(columns))
    arrays = {}
    for name in sorted(dtypes):
        arr = np.ascontiguousarray(np.asarray(columns[name]).astype(dtypes[name], copy=False))
        arrays[name] = arr.reshape(-1).view(np.uint8)  # its bytes, not a copy
    head = index_head({name: (raw.nbytes, hashlib.sha256(raw).hexdigest())
                       for name, raw in arrays.items()},
                      len(columns["rows"]), len(columns["shard_rows"]))
    # Each column copied once, by the join (at 100 M row groups the index is ~4 GB: a copy
    # per column, then one per join, were three of it)
    parts: list[Any] = [head]
    for raw in arrays.values():
        parts += [raw, padding(raw.nbytes)]
    return b"".join(parts)


def digest_algorithm(shards: Sequence[Any]) -> str:
    """The row-group digest an index of ``shards`` keeps: BLAKE3 when every row group has one
    (the pipeline records it now), else SHA-256 (a v1 dataset being upgraded)."""
    groups = [g for s in shards for g in s.row_groups]
    return PIECE_DIGEST if groups and all(g.blake3 for g in groups) else SHA256


def build_index(shards: Sequence[Any], digest: str | None = None) -> bytes:
    """The index of ``shards`` (``storage.format.manifest.ShardInfo``, in manifest order); its
    ``digest`` column holds the row groups' ``digest`` digests (default: what
    :func:`digest_algorithm` finds; callers that record it pass it, so it is found once)."""
    return build_index_arrays(index_columns(shards, digest or digest_algorithm(shards)))


def index_columns(shards: Sequence[Any], digest: str) -> dict[str, np.ndarray]:
    """The columns :func:`build_index` writes for ``shards`` (``pipeline.output.shard_table`` makes
    the same from compact records, without ``ShardInfo`` objects)."""
    groups = [g for s in shards for g in s.row_groups]
    columns = {
        "rows": np.array([g.rows for g in groups], dtype=np.uint64),
        "tokens": np.array([g.tokens for g in groups], dtype=np.uint64),
        "offset": np.array([g.offset for g in groups], dtype=np.uint64),
        "length": np.array([g.length for g in groups], dtype=np.uint64),
        "digest": _hex_to_bytes([g.blake3 if digest == PIECE_DIGEST else g.sha256
                                 for g in groups], DIGEST_BYTES),
        **ShardFields(
            [s.path.encode() for s in shards], [len(s.row_groups) for s in shards],
            [s.rows for s in shards], [s.tokens for s in shards], [s.bytes for s in shards],
            [raw_digest(s.sha256, 32) for s in shards], [s.footer_length for s in shards],
            [raw_digest(s.footer_sha256, 32) for s in shards],
            [CODECS.get(s.codec, NO_CODEC) for s in shards]).columns(),
    }
    for name in ("rows", "tokens", "length"):
        if len(columns[name]) and int(columns[name].max()) >= 1 << 32:
            raise ValueError(f"a row group's {name} does not fit in 32 bits")
    return columns


def index_ref(path: str, data: bytes, digest: str = SHA256) -> IndexRef:
    return IndexRef(path, len(data), hashlib.sha256(data).hexdigest(),
                    hashlib.sha256(header_bytes(data)).hexdigest(), digest)


def header_bytes(data: bytes) -> bytes:
    if data[:8] != MAGIC:
        raise IndexFormatError("not a shardflow row-group index (bad magic)")
    length = int(np.frombuffer(data[8:16], dtype="<u8")[0])
    return bytes(data[16:16 + length])


@dataclass(frozen=True)
class IndexHeader:
    row_groups: int
    shards: int
    columns: dict[str, dict[str, Any]]
    data_start: int

    @classmethod
    def parse(cls, head: bytes, header_sha256: str | None = None) -> IndexHeader:
        """From the object's first bytes (at least up to the end of the header)."""
        raw = header_bytes(head)
        if len(raw) < int(np.frombuffer(head[8:16], dtype="<u8")[0]):
            raise IndexFormatError("index header truncated")
        return cls.from_raw(raw, header_sha256)

    @classmethod
    def from_raw(cls, raw: bytes, header_sha256: str | None = None) -> IndexHeader:
        """From the header's JSON bytes alone (what ``header_sha256`` is the checksum of).

        Every field is checked here (types, ranges, each column's dtype is the one the format
        fixes), so a crafted header fails with one :class:`IndexFormatError` naming the field
        instead of a numpy error later."""
        if header_sha256 is not None and hashlib.sha256(raw).hexdigest() != header_sha256:
            raise IndexFormatError("index header checksum differs from the manifest's")
        try:
            h = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise IndexFormatError(f"index header is not JSON ({exc})") from None
        if not isinstance(h, dict):
            raise IndexFormatError("index header is not a JSON object")
        if h.get("format") != FORMAT:
            raise IndexFormatError(f"index format {h.get('format')!r}, expected {FORMAT!r}")
        columns = h.get("columns")
        if not isinstance(columns, dict):
            raise IndexFormatError("index header field 'columns' is not an object")
        optional = {k: v for k, v in OPTIONAL_SHARD_COLUMNS.items() if k in columns}
        for name, dtype in {**GROUP_COLUMNS, **SHARD_COLUMNS, **optional}.items():
            c = columns.get(name)
            if not isinstance(c, dict):
                raise IndexFormatError(f"index header: column {name!r} is missing")
            if c.get("dtype") != dtype:
                raise IndexFormatError(f"index header: column {name!r} has dtype "
                                       f"{c.get('dtype')!r}, expected {dtype!r}")
            for key in ("offset", "bytes"):
                _count_field(c.get(key), f"columns.{name}.{key}")
            if int(c["bytes"]) % np.dtype(dtype).itemsize:
                raise IndexFormatError(f"index header: columns.{name}.bytes = {c['bytes']} is "
                                       f"not a multiple of the {dtype} item size")
            if not isinstance(c.get("sha256"), str):
                raise IndexFormatError(f"index header: columns.{name}.sha256 is not a string")
        start = 16 + len(raw)
        start += -start % ALIGN
        return cls(_count_field(h.get("row_groups"), "row_groups"),
                   _count_field(h.get("shards"), "shards"), dict(columns), start)

    def span(self, name: str) -> tuple[int, int]:
        c = self.columns[name]
        lo = self.data_start + int(c["offset"])
        return lo, lo + int(c["bytes"])

    def decode(self, name: str, data: bytes) -> np.ndarray:
        """Column ``name`` from its bytes: checksum, then length (rows of its table)."""
        c = self.columns[name]
        if hashlib.sha256(data).hexdigest() != c["sha256"]:
            raise IndexFormatError(f"index column {name!r} checksum mismatch")
        arr = np.frombuffer(data, dtype=c["dtype"])
        want = {**dict.fromkeys(GROUP_COLUMNS, self.row_groups),
                **dict.fromkeys(SHARD_COLUMNS, self.shards),
                **dict.fromkeys(OPTIONAL_SHARD_COLUMNS, self.shards),
                "first_group": self.shards + 1, "path_end": self.shards + 1}.get(name)
        if name != "paths" and want is not None and len(arr) != want:
            raise IndexFormatError(f"index column {name!r} has {len(arr)} values, the header "
                                   f"says {want}")
        return arr


def _count_field(value: Any, name: str) -> int:
    """A non-negative integer field of the header (JSON ``true`` is not one)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 63:
        raise IndexFormatError(f"index header field {name!r} is {value!r}, not a count")
    return value


def check_values(cols: dict[str, np.ndarray], where: str = "index") -> None:
    """The values a reader relies on are in range, for whichever columns are at hand.

    A crafted index whose checksums were recomputed passes every checksum; these checks make
    it fail with one :class:`IndexFormatError` naming the column and the first bad row,
    instead of a numpy error (or a silently wrong read) in the loader:

    - ``first_group``: starts at 0, never decreases, ends at the number of row groups;
    - ``path_end``: starts at 0, never decreases, ends at the length of ``paths``; each path
      is UTF-8 and stays inside the dataset root;
    - ``footer_length`` fits in ``shard_bytes``; each row group's ``offset + length`` lies in
      its shard before the footer;
    - ``shard_codec`` is a codec :mod:`storage.format.chunk_footer` knows, or 255.
    """
    def bad(name: str, i: int, text: str) -> IndexFormatError:
        return IndexFormatError(f"{where}: {name}[{i}] {text}")

    def monotonic(name: str, end: int | None) -> np.ndarray:
        v = cols[name].astype(np.uint64)
        if len(v) == 0:
            raise bad(name, 0, "is missing (the column is empty)")
        if int(v[0]) != 0:
            raise bad(name, 0, f"= {int(v[0])}, must be 0")
        down = np.flatnonzero(v[1:] < v[:-1])
        if len(down):
            i = int(down[0]) + 1
            raise bad(name, i, f"= {int(v[i])} is less than the value before it")
        if end is not None and int(v[-1]) != end:
            raise bad(name, len(v) - 1, f"= {int(v[-1])}, must be {end}")
        return v

    if "shard_codec" in cols:
        known = np.array([*CODECS.values(), NO_CODEC], dtype=np.uint8)
        odd = np.flatnonzero(~np.isin(cols["shard_codec"], known))
        if len(odd):
            raise bad("shard_codec", int(odd[0]), f"= {int(cols['shard_codec'][odd[0]])} is "
                      "not a known Parquet codec")
    groups = next((len(cols[n]) for n in GROUP_COLUMNS if n in cols), None)
    first = monotonic("first_group", groups) if "first_group" in cols else None
    if "path_end" in cols:
        monotonic("path_end", len(cols["paths"]) if "paths" in cols else None)
        if "paths" in cols:
            try:
                shard_paths(cols)
            except UnicodeDecodeError as exc:
                raise IndexFormatError(f"{where}: paths is not UTF-8 ({exc})") from None
            except UnsafePathError as exc:
                raise IndexFormatError(f"{where}: paths: {exc}") from None
    if "shard_bytes" in cols and "footer_length" in cols:
        size = cols["shard_bytes"].astype(np.uint64)
        over = np.flatnonzero(cols["footer_length"].astype(np.uint64) > size)
        if len(over):
            raise bad("footer_length", int(over[0]), f"= {int(cols['footer_length'][over[0]])}"
                      f" exceeds the shard's {int(size[over[0]])} bytes")
    if first is not None and {"offset", "length", "shard_bytes"} <= set(cols):
        counts = np.diff(first.astype(np.int64))
        limit = cols["shard_bytes"].astype(object)
        if "footer_length" in cols:
            limit = limit - cols["footer_length"].astype(object)
        limit = np.repeat(limit, counts)
        end = cols["offset"].astype(object) + cols["length"].astype(object)
        past = np.flatnonzero(end > limit)
        if len(past):
            i = int(past[0])
            raise bad("offset", i, f"+ length = {end[i]} runs past the end of its shard's "
                      f"row groups ({limit[i]} bytes)")


HEAD_GUESS = 4096  # one read gets the magic, length and (all but huge) headers


def read_columns(read_range, names: Sequence[str], header_sha256: str | None = None
                 ) -> dict[str, np.ndarray]:
    """Only the columns ``names`` of an index, each verified, through ``read_range(lo, hi)``
    (one ranged read for the header, one per column)."""
    head = read_range(0, HEAD_GUESS)
    length = int(np.frombuffer(head[8:16], dtype="<u8")[0]) if len(head) >= 16 else 0
    if head[:8] == MAGIC and 16 + length > len(head):
        head = read_range(0, 16 + length)
    header = IndexHeader.parse(head, header_sha256)
    return {name: header.decode(name, read_range(*header.span(name))) for name in names}


def read_index(data: bytes, header_sha256: str | None = None) -> dict[str, np.ndarray]:
    """Every column of an index object held in memory (zero-copy views of ``data``)."""
    return read_columns(lambda lo, hi: memoryview(data)[lo:hi], list(
        IndexHeader.parse(data, header_sha256).columns), header_sha256)


def shard_paths(columns: dict[str, np.ndarray]) -> list[str]:
    blob = bytes(columns["paths"])
    ends = columns["path_end"].astype(np.int64)
    return [safe_relative(blob[a:b].decode()) for a, b in zip(ends[:-1], ends[1:], strict=True)]


#: the columns a loader needs: the plan (``tokens``), and where each row group and footer is
LOADER_PLAN_COLUMNS = ("tokens", "first_group")
#: (``first_group`` again, 8 bytes per shard: without it the row groups' byte ranges could
#: not be checked against their shard's size, see :func:`check_values`)
LOADER_READ_COLUMNS = ("first_group", "offset", "length", "digest", "shard_bytes",
                       "shard_sha256", "footer_length", "footer_sha256", "path_end", "paths")
#: read when the index has them: with ``shard_codec`` a shard's footer is never fetched
LOADER_OPTIONAL_COLUMNS = tuple(OPTIONAL_SHARD_COLUMNS)



def encode(shards: Sequence[ShardInfo]) -> tuple[bytes, IndexRef]:
    """The index object of ``shards`` and the reference a manifest records for it."""
    digest = digest_algorithm(shards)
    return encode_columns(index_columns(shards, digest), digest)


def encode_columns(columns: dict[str, np.ndarray], digest: str) -> tuple[bytes, IndexRef]:
    """:func:`encode` from the index's columns (``digest``: their row-group digest's
    algorithm)."""
    data = build_index_arrays(columns)
    return data, index_ref(index_name(hashlib.sha256(data).hexdigest()), data, digest)


def with_index(manifest: Manifest, shards: Sequence[ShardInfo], ref: IndexRef) -> Manifest:
    """``manifest`` as ``shardflow.dataset/2``: its shards named by the index ``ref``."""
    return indexed(manifest, Totals.of(list(shards)), ref)


def indexed(manifest: Manifest, totals: Totals, ref: IndexRef) -> Manifest:
    """:func:`with_index` given the shards' ``totals`` (a writer that kept no ``ShardInfo``)."""
    return replace(manifest, shards=(), format=FORMAT_V2, index=ref, totals=totals)


def check_counts(manifest: Manifest, cols: dict[str, np.ndarray]) -> None:
    """The index agrees with the manifest's ``totals`` (for the columns at hand)."""
    t = manifest.counts
    where = manifest.index.path if manifest.index else "index"
    for name, total in (("tokens", t.tokens), ("rows", t.rows)):
        if name in cols:
            if len(cols[name]) != t.row_groups:
                raise ManifestError(f"{where}: {len(cols[name])} row groups, the manifest's "
                                    f"totals say {t.row_groups}")
            if int(cols[name].sum(dtype=np.uint64)) != total:
                raise ManifestError(f"{where}: row-group {name} add up to "
                                    f"{int(cols[name].sum(dtype=np.uint64))}, the manifest's "
                                    f"totals say {total}")
    if "first_group" in cols and (len(cols["first_group"]) != t.shards + 1
                                  or int(cols["first_group"][-1]) != t.row_groups):
        raise ManifestError(f"{where}: shard table does not match the manifest's totals "
                            f"({t.shards} shards, {t.row_groups} row groups)")


class IndexShards(Sequence[ShardInfo]):
    """A v2 dataset's shards as a sequence of ``ShardInfo``, each built from the index's
    columns when it is asked for, never all at once.

    ``ShardInfo`` and ``RowGroupInfo`` objects cost ~510 bytes a row group: an admin tool
    (``verify``, ``repair``, ``export``) over a 100 TB dataset (~90 M row groups) that built them
    all held ~46 GB; the columns are 36 bytes a row group (~3.3 GB). :meth:`get` finds a shard by
    path (a dict of the paths, made at its first use); :meth:`objects` lists ``(path, bytes,
    sha256)`` from the per-shard columns alone."""

    def __init__(self, cols: dict[str, np.ndarray], digest: str = SHA256) -> None:
        self._cols = cols
        self._paths = shard_paths(cols)
        self._first = cols["first_group"].astype(np.int64)
        self._field = "blake3" if digest == PIECE_DIGEST else "sha256"
        name_of = {v: k for k, v in CODECS.items()}
        codecs = (cols["shard_codec"].tolist() if "shard_codec" in cols
                  else [NO_CODEC] * len(self._paths))
        self._codecs = [name_of.get(c, "") for c in codecs]
        self._by_path: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self._paths)

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, i: slice) -> list[ShardInfo]: ...
    def __getitem__(self, i: int | slice) -> ShardInfo | list[ShardInfo]:
        if isinstance(i, slice):
            return [self._shard(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"shard {i} of {len(self)}")
        return self._shard(i)

    def _shard(self, s: int) -> ShardInfo:
        c = self._cols
        lo, hi = int(self._first[s]), int(self._first[s + 1])
        digests = c["digest"][lo:hi].tobytes()
        groups = tuple(
            RowGroupInfo(rows, toks, off, n, **{
                self._field: digests[k * DIGEST_BYTES:(k + 1) * DIGEST_BYTES].hex()})
            for k, (rows, toks, off, n) in enumerate(zip(
                c["rows"][lo:hi].tolist(), c["tokens"][lo:hi].tolist(),
                c["offset"][lo:hi].tolist(), c["length"][lo:hi].tolist(), strict=True)))
        return ShardInfo(
            path=self._paths[s], rows=int(c["shard_rows"][s]), tokens=int(c["shard_tokens"][s]),
            bytes=int(c["shard_bytes"][s]), sha256=digest_hex(c["shard_sha256"], s),
            row_groups=groups, footer_length=int(c["footer_length"][s]),
            footer_sha256=digest_hex(c["footer_sha256"], s), codec=self._codecs[s])

    def get(self, path: str) -> ShardInfo | None:
        """The shard at ``path``, or ``None``."""
        if self._by_path is None:
            self._by_path = {p: i for i, p in enumerate(self._paths)}
        i = self._by_path.get(path)
        return None if i is None else self._shard(i)

    def objects(self) -> list[tuple[str, int, str]]:
        """``(path, bytes, sha256)`` of every shard, without building a ``ShardInfo``."""
        sizes = self._cols["shard_bytes"].tolist()
        shas = self._cols["shard_sha256"]
        return [(p, sizes[i], digest_hex(shas, i)) for i, p in enumerate(self._paths)]


def shards_from_columns(cols: dict[str, np.ndarray], digest: str = SHA256
                        ) -> tuple[ShardInfo, ...]:
    """Every shard of the index ``cols`` as ``ShardInfo`` (all at once: small indexes, tests;
    :class:`IndexShards` builds them one at a time)."""
    return tuple(IndexShards(cols, digest))
