"""The binary row-group index: per-row-group metadata as columns in one object.

A dataset of a million row groups would need ~150 MB of ``manifest.json`` to list them; the
index holds the same facts in 36 bytes per row group (``rows`` u4, ``tokens`` u4, ``offset``
u8, ``length`` u4, ``digest``: the first 16 bytes of the token column chunk's sha256), plus
one small record per shard, and a reader fetches only the columns it needs with ranged reads.

Layout (all little-endian)::

    b"SFIDX\\x01\\0\\0"  u8 header length  header (JSON)  columns, each 64-byte aligned

The header names each column's dtype, offset, byte length and sha256 (hex), so every column
read alone is verified; the manifest records the sha256 of the whole object and of the header
(``IndexRef``), so the header, hence every column, is anchored in the manifest.

Group columns: ``rows``, ``tokens``, ``offset``, ``length``, ``digest`` (16 bytes: a truncated
sha256 keeps the audit property at 128 bits). Shard columns: ``first_group`` (S+1),
``shard_rows``, ``shard_tokens``, ``shard_bytes``, ``shard_sha256`` (32 bytes),
``footer_length``, ``footer_sha256`` (32 bytes), ``path_end`` (S+1) and ``paths`` (the
shard paths, UTF-8, concatenated).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.layout import safe_relative

MAGIC = b"SFIDX\x01\x00\x00"
FORMAT = "shardflow.index/1"
DIGEST_BYTES = 16
_ALIGN = 64

GROUP_COLUMNS = {"rows": "<u4", "tokens": "<u4", "offset": "<u8", "length": "<u4",
                 "digest": f"V{DIGEST_BYTES}"}
SHARD_COLUMNS = {"first_group": "<u8", "shard_rows": "<u8", "shard_tokens": "<u8",
                 "shard_bytes": "<u8", "shard_sha256": "V32", "footer_length": "<u8",
                 "footer_sha256": "V32", "path_end": "<u8", "paths": "u1"}


class IndexFormatError(ValueError):
    """An index object that cannot be trusted (bad magic, header, or checksum)."""


@dataclass(frozen=True)
class IndexRef:
    """What a manifest records about its index object."""

    path: str
    bytes: int
    sha256: str
    header_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256,
                "header_sha256": self.header_sha256}


def _hex_to_bytes(values: Sequence[str], width: int) -> np.ndarray:
    out = np.zeros(len(values), dtype=f"V{width}")
    if len(values):
        raw = b"".join(bytes.fromhex(v)[:width].ljust(width, b"\0") for v in values)
        out[:] = np.frombuffer(raw, dtype=f"V{width}")
    return out


def digest_hex(column: np.ndarray, i: int) -> str:
    """Row ``i`` of a digest column as hex (32 chars for ``digest``, 64 for the sha256s)."""
    return bytes(column[i]).hex()


def build_index_arrays(columns: dict[str, np.ndarray]) -> bytes:
    """The index object from its columns (names and dtypes of ``GROUP_COLUMNS`` and
    ``SHARD_COLUMNS``). Deterministic: the same columns give the same bytes."""
    want = {**GROUP_COLUMNS, **SHARD_COLUMNS}
    if set(columns) != set(want):
        raise ValueError(f"index columns {sorted(columns)}, expected {sorted(want)}")
    n_groups = len(columns["rows"])
    n_shards = len(columns["shard_rows"])
    blobs, table = [], {}
    offset = 0
    for name in sorted(want):
        arr = np.ascontiguousarray(np.asarray(columns[name]).astype(want[name], copy=False))
        data = arr.tobytes()
        table[name] = {"dtype": want[name], "offset": offset, "bytes": len(data),
                       "sha256": hashlib.sha256(data).hexdigest()}
        pad = -len(data) % _ALIGN
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    header = json.dumps({"format": FORMAT, "row_groups": n_groups, "shards": n_shards,
                         "columns": table}, sort_keys=True).encode()
    head = MAGIC + np.uint64(len(header)).tobytes() + header
    head += b"\0" * (-len(head) % _ALIGN)
    return head + b"".join(blobs)


def build_index(shards: Sequence[Any]) -> bytes:
    """The index of ``shards`` (``storage.manifest.ShardInfo``, in manifest order)."""
    groups = [g for s in shards for g in s.row_groups]
    paths = [s.path.encode() for s in shards]
    counts = np.array([len(s.row_groups) for s in shards], dtype=np.uint64)
    columns = {
        "rows": np.array([g.rows for g in groups], dtype=np.uint64),
        "tokens": np.array([g.tokens for g in groups], dtype=np.uint64),
        "offset": np.array([g.offset for g in groups], dtype=np.uint64),
        "length": np.array([g.length for g in groups], dtype=np.uint64),
        "digest": _hex_to_bytes([g.sha256 for g in groups], DIGEST_BYTES),
        "first_group": np.concatenate([[0], np.cumsum(counts)]).astype(np.uint64),
        "shard_rows": np.array([s.rows for s in shards], dtype=np.uint64),
        "shard_tokens": np.array([s.tokens for s in shards], dtype=np.uint64),
        "shard_bytes": np.array([s.bytes for s in shards], dtype=np.uint64),
        "shard_sha256": _hex_to_bytes([s.sha256 for s in shards], 32),
        "footer_length": np.array([s.footer_length for s in shards], dtype=np.uint64),
        "footer_sha256": _hex_to_bytes([s.footer_sha256 for s in shards], 32),
        "path_end": np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.uint64),
        "paths": np.frombuffer(b"".join(paths), dtype=np.uint8),
    }
    for name in ("rows", "tokens", "length"):
        if len(columns[name]) and int(columns[name].max()) >= 1 << 32:
            raise ValueError(f"a row group's {name} does not fit in 32 bits")
    return build_index_arrays(columns)


def index_ref(path: str, data: bytes) -> IndexRef:
    return IndexRef(path, len(data), hashlib.sha256(data).hexdigest(),
                    hashlib.sha256(_header_bytes(data)).hexdigest())


def _header_bytes(data: bytes) -> bytes:
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
        raw = _header_bytes(head)
        if len(raw) < int(np.frombuffer(head[8:16], dtype="<u8")[0]):
            raise IndexFormatError("index header truncated")
        if header_sha256 is not None and hashlib.sha256(raw).hexdigest() != header_sha256:
            raise IndexFormatError("index header checksum differs from the manifest's")
        h = json.loads(raw)
        if h.get("format") != FORMAT:
            raise IndexFormatError(f"index format {h.get('format')!r}, expected {FORMAT!r}")
        start = 16 + len(raw)
        start += -start % _ALIGN
        return cls(int(h["row_groups"]), int(h["shards"]), dict(h["columns"]), start)

    def span(self, name: str) -> tuple[int, int]:
        c = self.columns[name]
        lo = self.data_start + int(c["offset"])
        return lo, lo + int(c["bytes"])

    def decode(self, name: str, data: bytes) -> np.ndarray:
        c = self.columns[name]
        if hashlib.sha256(data).hexdigest() != c["sha256"]:
            raise IndexFormatError(f"index column {name!r} checksum mismatch")
        return np.frombuffer(data, dtype=c["dtype"])


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
