"""Check one object on one replica the way a reader will use it, in bounded memory.

``storage verify`` used to read each object whole (``cat_file``) and compare one sha256: a
2 GiB shard cost 2 GiB of RAM, and a crafted index whose checksums were recomputed passed
while the loader refused it. Here an object is checked in this order, each step only once
the ones before passed:

1. its size, from ``fs.info``, against what the manifest or index says (no read at all when
   it differs: a truncated or padded object is named at once);
2. its bytes, streamed in ``CHUNK``-sized ranged reads, hashed incrementally: the whole
   object's sha256, and for a shard each row group's piece digest (the loader's per-read
   check) and the footer's sha256;
3. for a shard, what the loader decodes: the footer parses, holds as many row groups as the
   index gives the shard, places each row group's token chunk where the index does, agrees
   with the codec the index records, and each row group's token column decodes to the
   ``tokens`` the plan counts on (and ``rows`` rows) -- under the footer the loader uses:
   the shard's own, or the one made from the index where the codec is recorded
   (:mod:`storage.format.chunk_footer`).

Memory: one chunk, plus the row group and footer being decoded (what a reader holds too;
row groups over ``DECODE_LIMIT`` bytes are hashed but not decoded).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from storage.format import chunk_footer
from storage.format import tokens as token_codec
from storage.format.checksums import PIECE_DIGEST
from storage.format.manifest import ShardInfo
from storage.io.clients import read_range
from storage.io.range_file import RangeFile
from storage.io.urls import Location

CHUNK = 4 << 20
#: objects read whole (manifests, version records, markers) may not be larger than this
SMALL_OBJECT_LIMIT = 64 << 20
#: a row group (or footer) up to this size is kept while streaming, to be decoded
DECODE_LIMIT = 256 << 20


@dataclass(frozen=True)
class Finding:
    """What is wrong with one object on one replica: ``kind`` is ``missing``,
    ``unreachable`` or ``corrupt``; ``detail`` names the field that disagrees."""

    kind: str
    detail: str = ""


def _hasher(algorithm: str) -> Any:
    if algorithm == PIECE_DIGEST:
        import blake3

        return blake3.blake3()
    return hashlib.sha256()


@dataclass
class _Piece:
    """A byte range hashed (and maybe kept) while the object streams past."""

    start: int
    end: int
    want: str  # hex prefix the digest must start with
    label: str
    hasher: Any
    keep: bytearray | None = None
    group: int = -1  # the row group's number in its shard (-1: the footer)


def _size(loc: Location, path: str) -> int | Finding:
    try:
        info = loc.fs.info(loc.path(path))
    except FileNotFoundError:
        return Finding("missing")
    except Exception as exc:
        return Finding("unreachable", f"{type(exc).__name__}: {exc}"[:200])
    if info.get("type") == "directory":
        return Finding("corrupt", "a directory where the object should be")
    return int(info.get("size") or 0)


def read_small(loc: Location, path: str, limit: int = SMALL_OBJECT_LIMIT) -> bytes:
    """A small object whole (a manifest, a version record), its size checked first, so a
    crafted multi-GB ``manifest.json`` is refused instead of read into memory."""
    size = _size(loc, path)
    if isinstance(size, Finding):
        if size.kind == "missing":
            raise FileNotFoundError(loc.path(path))
        raise OSError(f"{path}: {size.kind} {size.detail}".rstrip())
    if size > limit:
        raise OSError(f"{path}: {size:,} bytes, more than the {limit:,} an admin tool reads")
    return bytes(loc.fs.cat_file(loc.path(path)))


def check_object(loc: Location, path: str, size: int, sha256: str,
                 shard: ShardInfo | None = None, algorithm: str = PIECE_DIGEST,
                 encoding: str | None = None) -> Finding | None:
    """``None`` when ``path`` on ``loc`` is what a reader needs; else what is wrong.

    ``shard``: the object is this shard (its row groups' ranges, digests and counts, its
    footer are checked too); ``algorithm``: the row groups' digest (the index's
    ``digest``); ``encoding``: the manifest's ``input_ids`` schema (tokens are counted
    when given).
    """
    actual = _size(loc, path)
    if isinstance(actual, Finding):
        return actual
    if actual != size:
        return Finding("corrupt", f"size {actual:,} bytes, the manifest/index field bytes "
                                  f"says {size:,}")
    pieces: list[_Piece] = []
    if shard is not None:
        for i, g in enumerate(shard.row_groups):
            want = g.blake3 if algorithm == PIECE_DIGEST else g.sha256
            if not want:
                continue  # a dataset from before row-group locations: nothing recorded
            if g.offset + g.length > size:
                return Finding("corrupt", f"row group {i}: offset + length = "
                                          f"{g.offset + g.length:,} past the end ({size:,})")
            keep = bytearray() if encoding and g.length <= DECODE_LIMIT else None
            pieces.append(_Piece(g.offset, g.offset + g.length, want, f"row group {i}",
                                 _hasher(algorithm), keep, i))
        if pieces and not (shard.footer_length and shard.footer_sha256):
            # Row groups located but not the footer: the loader refuses such a shard (it
            # decodes the footer it fetched and checked, never one it finds), so must verify.
            return Finding("corrupt", "no footer location recorded (footer_length "
                                      f"{shard.footer_length}): the loader cannot read this "
                                      "shard; rebuild the dataset")
        if shard.footer_length and shard.footer_sha256:
            if shard.footer_length > size:
                return Finding("corrupt", f"footer_length {shard.footer_length:,} exceeds the "
                                          f"object ({size:,} bytes)")
            keep = bytearray() if shard.footer_length <= DECODE_LIMIT else None
            pieces.append(_Piece(size - shard.footer_length, size, shard.footer_sha256,
                                 "footer", hashlib.sha256(), keep))
    whole = hashlib.sha256()
    order = sorted(pieces, key=lambda p: p.start)
    try:
        pos = 0
        while pos < size:
            chunk = bytes(read_range(loc.fs, loc.path(path), pos, min(size, pos + CHUNK)))
            if not chunk:
                return Finding("corrupt", f"object ends at {pos:,} bytes, its size said "
                                          f"{size:,}")
            whole.update(chunk)
            end = pos + len(chunk)
            for p in order:
                if p.start >= end:
                    break
                if p.end > pos:
                    part = chunk[max(p.start, pos) - pos:min(p.end, end) - pos]
                    p.hasher.update(part)
                    if p.keep is not None:
                        p.keep += part
            pos = end
    except FileNotFoundError:
        return Finding("missing")
    except Exception as exc:
        return Finding("unreachable", f"{type(exc).__name__}: {exc}"[:200])
    got = whole.hexdigest()
    if got != sha256:
        return Finding("corrupt", f"sha256 {got[:12]}... != manifest {sha256[:12]}...")
    for p in pieces:
        digest = p.hasher.hexdigest()
        if not digest.startswith(p.want):
            field = "footer_sha256" if p.group < 0 else "digest"
            return Finding("corrupt", f"{p.label} [{p.start:,}, {p.end:,}): {field} "
                                      f"{p.want[:12] or '(none)'}... does not match its bytes")
    if shard is not None and encoding:
        return _decode(shard, pieces, size, encoding)
    return None


def _decode(shard: ShardInfo, pieces: list[_Piece], size: int,
            encoding: str) -> Finding | None:
    """What the loader decodes: the footer, then each row group's token column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    footer = next((p for p in pieces if p.group < 0), None)
    if footer is None or footer.keep is None:
        return None  # no recorded footer (an old dataset): the loader refuses it itself
    try:
        meta = token_codec.parse_footer(footer.keep)
    except Exception as exc:
        return Finding("corrupt", f"footer does not parse ({type(exc).__name__}: {exc})"[:200])
    problem = token_codec.footer_disagreement(
        meta, [(g.offset, g.length) for g in shard.row_groups])
    if problem is not None:
        return Finding("corrupt", problem)
    codec = chunk_footer.footerless_codec(meta)
    if shard.codec and codec != shard.codec:
        return Finding("corrupt", f"the index records codec {shard.codec}, the footer's "
                                  f"token chunks are {codec or 'not footer-free'}")
    for p in pieces:
        if p.group < 0 or p.keep is None:
            continue
        g = shard.row_groups[p.group]
        try:
            if shard.codec:  # decoded as the loader does: under a footer from the index
                values, raw = chunk_footer.page_values(p.keep)
                one = chunk_footer.metadata([(0, len(p.keep), values, raw)],
                                            chunk_footer.CODECS[shard.codec])
                table = pq.ParquetFile(pa.BufferReader(pa.py_buffer(p.keep)),
                                       metadata=one).read_row_group(0, use_threads=False)
            else:
                table = pq.ParquetFile(RangeFile(size, p.start, bytes(p.keep), p.label),
                                       metadata=meta).read_row_group(
                    p.group, columns=["input_ids"], use_threads=False)
            count = len(token_codec.unpack(table.column(0), encoding))
        except Exception as exc:
            return Finding("corrupt", f"{p.label} does not decode "
                                      f"({type(exc).__name__}: {exc})"[:200])
        if count != g.tokens:
            return Finding("corrupt", f"{p.label}: tokens {g.tokens:,} in the index, "
                                      f"{count:,} in the shard")
        if table.num_rows != g.rows:
            return Finding("corrupt", f"{p.label}: rows {g.rows:,} in the index, "
                                      f"{table.num_rows:,} in the shard")
    return None
