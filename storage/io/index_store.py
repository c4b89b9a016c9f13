"""The row-group index on the store (its format is :mod:`storage.format.index`).

:func:`write_index` puts it, :func:`fetch_columns` reads the columns a caller needs (ranged
reads, each verified, through a local cache when given) and :func:`shards_of` gives admin tools
the ``ShardInfo`` list of either manifest format.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from storage.format.index import (
    GROUP_COLUMNS,
    HEAD_GUESS,
    MAGIC,
    OPTIONAL_SHARD_COLUMNS,
    SHARD_COLUMNS,
    IndexFormatError,
    IndexHeader,
    IndexShards,
    check_counts,
    check_values,
    encode,
    header_bytes,
    read_index,
    shard_paths,
)
from storage.format.manifest import IndexRef, Manifest, ObjectInfo, ShardInfo
from storage.format.object_list import encode_objects, parse_objects
from storage.io.replicas.replica_set import ChecksumMismatchError, ReplicaSet

#: an index up to this size is fetched (and cached) whole, in one GET; a larger one column by
#: column, only the columns asked for
WHOLE_OBJECT_BYTES = 4 << 20


class PieceCache(Protocol):
    """A local cache of verified pieces keyed by their sha256 (``loaders.cache.ChunkCache``)."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, data: bytes) -> None: ...


def write_index(store: ReplicaSet, shards: Sequence[ShardInfo]) -> IndexRef:
    """Put the index of ``shards`` (the store's quorum put; the name is its content's, so a
    rerun rewrites the same bytes under the same name) and return its reference."""
    data, ref = encode(shards)
    store.put(ref.path, data)
    return ref


def _through(cache: PieceCache | None, key: str, fetch: Callable[[], bytes]) -> bytes:
    data = cache.get(key) if cache is not None else None
    if data is None:
        data = fetch()
        if cache is not None and data:
            cache.put(key, data)
    return data


def _fetch_header(store: ReplicaSet, ref: IndexRef) -> bytes:
    def fetch(loc) -> bytes:  # type: ignore[no-untyped-def]
        path = loc.path(ref.path)
        head = loc.fs.cat_file(path, start=0, end=min(HEAD_GUESS, ref.bytes))
        if len(head) >= 16 and head[:8] == MAGIC:
            need = 16 + int(np.frombuffer(head[8:16], dtype="<u8")[0])
            if need > len(head):
                head = loc.fs.cat_file(path, start=0, end=min(need, ref.bytes))
        try:
            raw = header_bytes(head)
        except IndexFormatError as exc:
            raise ChecksumMismatchError(f"{ref.path}: {exc}") from None
        if hashlib.sha256(raw).hexdigest() != ref.header_sha256:
            raise ChecksumMismatchError(f"{ref.path}: index header checksum differs from the "
                                        "manifest's")
        return raw

    return store.read(ref.path, fetch, f"{ref.path} (index header)")


def fetch_columns(store: ReplicaSet, ref: IndexRef, names: Sequence[str],
                  cache: PieceCache | None = None, optional: Sequence[str] = ()
                  ) -> dict[str, np.ndarray]:
    """The columns ``names`` of the index ``ref``, each verified (a corrupt replica fails over
    to the next), through ``cache`` when given (keys: the object's, the header's and each
    column's sha256, so a hit is always the right bytes).

    Small indexes (up to ``WHOLE_OBJECT_BYTES``) come in one GET; larger ones as the header
    plus one ranged GET per column asked for: a plan that needs ``tokens`` reads 4 bytes per
    row group, not 36. ``optional``: columns also read when the index has them (an index
    written before them has not).
    """
    if ref.bytes <= WHOLE_OBJECT_BYTES:
        data = _through(cache, ref.sha256, lambda: store.get(ref.path, sha256=ref.sha256))
        cols = read_index(data, ref.header_sha256)
        out = {name: cols[name] for name in names}
        out.update({name: cols[name] for name in optional if name in cols})
        check_values(out, ref.path)
        return out
    raw = _through(cache, ref.header_sha256, lambda: _fetch_header(store, ref))
    header = IndexHeader.from_raw(raw, ref.header_sha256)
    out = {}
    for name in (*names, *(n for n in optional if n in header.columns)):
        c = header.columns[name]
        lo, hi = header.span(name)
        if hi > ref.bytes:
            raise IndexFormatError(f"{ref.path}: column {name!r} ends past the object")
        data = b"" if hi == lo else _through(cache, c["sha256"], lambda lo=lo, hi=hi, c=c:
                                             store.get(ref.path, c["sha256"], lo, hi))
        out[name] = header.decode(name, data)
    check_values(out, ref.path)
    return out


def as_store(store: ReplicaSet | str) -> ReplicaSet:
    return ReplicaSet.from_urls([store]) if isinstance(store, str) else store


_SHARDS: OrderedDict[str, IndexShards] = OrderedDict()
_SHARDS_LOCK = threading.Lock()
_SHARDS_KEPT = 4


def shards_of(store: ReplicaSet | str, manifest: Manifest) -> Sequence[ShardInfo]:
    """The shards of ``manifest`` as ``ShardInfo``, whichever its format (for admin tools:
    scrub, gc, export, inspect; the loader reads index columns instead).

    v1: its inline shards (a tuple). v2: an :class:`storage.format.index.IndexShards` over its
    index's columns, read from ``store`` and verified against the manifest's ``IndexRef`` and
    totals, each ``ShardInfo`` built when asked for (36 bytes a row group held, not ~510:
    ~3 GB, not ~46 GB, for a 100 TB dataset); cached per index sha256 (a few per process).
    A row group's ``blake3`` (or, for an index of SHA-256 digests, ``sha256``) from an index
    is the first 32 hex digits (128 bits) of the token column chunk's digest: what the index
    keeps.
    """
    if manifest.index is None:
        return manifest.shards
    return _index_shards(store, manifest, manifest.index)


def _index_shards(store: ReplicaSet | str, manifest: Manifest, ref: IndexRef) -> IndexShards:
    with _SHARDS_LOCK:
        if ref.sha256 in _SHARDS:
            _SHARDS.move_to_end(ref.sha256)
            return _SHARDS[ref.sha256]
    cols = fetch_columns(as_store(store), ref, list({**GROUP_COLUMNS, **SHARD_COLUMNS}),
                         optional=list(OPTIONAL_SHARD_COLUMNS))
    check_counts(manifest, cols)
    shards = IndexShards(cols, ref.digest)
    with _SHARDS_LOCK:
        _SHARDS[ref.sha256] = shards
        while len(_SHARDS) > _SHARDS_KEPT:
            _SHARDS.popitem(last=False)
    return shards


def write_object_list(store: ReplicaSet, objects: Sequence[ObjectInfo],
                      name: Callable[[str], str]) -> ObjectInfo | None:
    """Put the list of ``objects`` (:mod:`storage.format.object_list`) under ``name(its
    sha256)`` and return what a manifest names it by (``None``, nothing put: no objects)."""
    if not objects:
        return None
    data = encode_objects(objects)
    sha = hashlib.sha256(data).hexdigest()
    info = ObjectInfo(name(sha), len(data), sha)
    store.put(info.path, data)
    return info


def drop_records_of(store: ReplicaSet | str, manifest: Manifest) -> tuple[ObjectInfo, ...]:
    """The drop records a version's list names (``()``: none), the list read verified."""
    if manifest.drops is None:
        return ()
    ref = manifest.drops
    return parse_objects(as_store(store).get(ref.path, sha256=ref.sha256), ref.path)


def objects_of(store: ReplicaSet | str, manifest: Manifest) -> list[tuple[str, int, str]]:
    """Every object a version consists of, ``(path, bytes, sha256)``, manifest aside: what the
    manifest names (for v2: the index, the tokenizer, the quarantine, the reports and the drop
    records' list), the shards and the drop records."""
    out = manifest.objects()
    if manifest.index is not None and manifest.view is None:  # a view's shards: its source's
        out += _index_shards(store, manifest, manifest.index).objects()
    out += [(o.path, o.bytes, o.sha256) for o in drop_records_of(store, manifest)]
    return out


def shard_paths_of(store: ReplicaSet | str, manifest: Manifest) -> list[str]:
    """Just the shard paths (two small columns of a v2 index)."""
    if manifest.index is None:
        return [s.path for s in manifest.shards]
    return shard_paths(fetch_columns(as_store(store), manifest.index, ["path_end", "paths"]))
