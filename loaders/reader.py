"""Token reads: global token ranges -> row groups of Parquet shards -> NumPy arrays.

The per-row-group token counts (:class:`loaders.row_groups.RowGroupIndex`: arrays from the
dataset's binary index, or a v1 manifest's inline shards) map any token offset to (shard, row
group) without opening a file. A row group's token column chunk is fetched with a ranged GET,
together with its neighbours in the same shard that the plan uses soon when the store is remote
(one request per unit of :mod:`loaders.coalesce`), through ``storage``'s replica set (failover,
back-off, hedging); each row group is checked against the
index's digest (the first 16 bytes of its BLAKE3, or of its SHA-256 in older datasets:
:mod:`storage.format.checksums`) before it is decoded.
With a :class:`loaders.cache.ChunkCache`, pieces already on local disk (re-verified there) are
not requested from the store at all, and fetched ones are added to it. Which row groups to
hold, and for how long, is :mod:`loaders.prefetch`'s job.

Decoding needs Parquet metadata. Where the index records the shard's codec, a footer is made
from the index for just the pieces of one request (:mod:`storage.format.chunk_footer`) and
dropped with it: no footer GET, nothing kept per shard. Otherwise (an index written before
it, or a local dataset small enough to keep its footers: ``LOCAL_FOOTER_GROUPS``) the shard's
own footer is fetched, checked (full SHA-256), parsed once per reader and kept.

A shard on a local replica is memory-mapped (:class:`MappedShards`) instead of read: a piece
is verified in place and pyarrow decodes it straight from the mapping. Pieces fetched from an
object store are decoded from the request's own buffer under a footer made from the index;
under a shard's own footer they are copied, verified, into a shard-sized anonymous mapping
that holds only them (:func:`_sparse_shard`; untouched pages are never allocated). Never
through a Python file object, whose every read pyarrow would call back into Python for
(~0.3 ms of CPU per row group; ``benchmarks/loader_throughput.py``), and nothing but verified
bytes to decode.
"""
from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from infra.process.local import ProcessLocal
from loaders.cache import ChunkCache
from loaders.decode import TokenChunks
from loaders.row_groups import RowGroupIndex
from storage import (
    ChecksumMismatchError,
    IndexFormatError,
    ManifestError,
    ReplicaSet,
    tokens,
)
from storage.format import chunk_footer
from storage.format.checksums import piece_matches
from storage.format.index import digest_hex
from storage.format.layout import UnsafePathError
from storage.format.view import Masks, kept_tokens
from storage.io.clients import read_range
from storage.io.local.paths import check_read
from storage.io.replicas.replica_set import InvalidObjectError

__all__ = ["RowGroupIndex", "TokenReader"]


class MappedShards:
    """Local shard files, memory-mapped: the most recently used ``limit`` stay mapped.

    A mapping is made once per shard and process, not per read: mapping and unmapping a file
    per row group cost ~0.5 CPU-s per billion tokens and ~10 % of the rate (TLB shoot-downs
    across the read threads). A mapping lives as long as a buffer of it is referenced (the
    file descriptor is closed at once), so dropping one from this table never invalidates a
    decode in flight, and a shard deleted by ``storage gc`` stays readable while mapped. The
    size is checked when the file is mapped, so a short (torn, truncated) file is a checksum
    failure the replica set fails over from, not a bus error on a read past its end. Shards
    are immutable once committed (new content gets a new name), so a mapping cannot change
    under a reader. Decoded pieces are released from the resident set (:meth:`release`).
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str, size: int, root: str | None = None) -> mmap.mmap:
        """The whole of the file ``path``, which must be ``size`` bytes, mapped read-only.

        ``root``: the dataset ``path`` is in; a path that reaches outside it through a symlink
        is refused (:func:`storage.io.local.paths.check_read`) when the file is mapped, once per
        mapping, not per row group read from it.
        """
        with self._lock:
            mapped = self._maps.get(path)
            if mapped is not None:
                self._maps.move_to_end(path)
                return mapped
        if root is not None:
            check_read(root, path)
        with open(path, "rb") as fh:
            actual = os.fstat(fh.fileno()).st_size
            if actual != size or not size:
                raise ChecksumMismatchError(f"{path}: {actual} bytes on disk, the index "
                                            f"says {size} (a truncated or different file)")
            mapped = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
        if self.limit:
            with self._lock:
                self._maps[path] = mapped
                while len(self._maps) > self.limit:
                    self._maps.popitem(last=False)
        return mapped

    @staticmethod
    def release(mapped: mmap.mmap, start: int, end: int) -> None:
        """Drop ``[start, end)`` from this process's resident set (the pages stay in the page
        cache; a later access maps them again), so a long-lived mapping does not count every
        page a reader ever touched in its RSS."""
        lo = start - start % mmap.PAGESIZE
        if end > lo:
            mapped.madvise(mmap.MADV_DONTNEED, lo, end - lo)

    def clear(self) -> None:
        with self._lock:
            self._maps.clear()


HOLE_BYTES = 1 << 20
#: the most bytes one GET asks for (loaders.prefetch.COALESCE_MAX_BYTES_CAP: the most a unit spans)
MAX_REQUEST_BYTES = 64 << 20


#: holes read through when the store is remote: a request costs a round trip (and a loopback
#: SeaweedFS reads a whole stored chunk per ranged GET), so ~2 MB more in one GET are cheaper
#: than a second GET
REMOTE_HOLE_BYTES = 2 << 20


def _coalesce(pieces: list[tuple[int, int, str, int | None]], hole_bytes: int = HOLE_BYTES
              ) -> list[list[tuple[int, int, str, int | None]]]:
    """Group sorted byte ranges into requests: small holes are read through, not re-requested."""
    requests: list[list[tuple[int, int, str, int | None]]] = []
    for piece in pieces:
        if requests:
            current = requests[-1]
            start = current[0][0]
            end = max(p[1] for p in current)
            if piece[0] - end <= hole_bytes and piece[1] - start <= MAX_REQUEST_BYTES:
                current.append(piece)
                continue
        requests.append([piece])
    return requests


def _sparse_shard(size: int, pieces: list[tuple[int, Any]]) -> mmap.mmap:
    """A shard-sized anonymous mapping holding only ``pieces`` (start, verified bytes) at
    their offsets: the rest reads as zeros and is never allocated (pages are made on first
    write), so a shard of any size costs only its pieces' pages, and a footer pointing
    outside them decodes zeros (an error), never bytes that were not verified."""
    # MAP_NORESERVE: a 1 GB shard's few pieces should not count 1 GB against overcommit
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    buf = mmap.mmap(-1, size, flags=flags)
    for start, data in pieces:
        buf[start:start + len(data)] = data
    return buf


#: A dataset on local disk of up to this many row groups is decoded under its shards' own
#: footers, each parsed once and kept (~1.8 KB per row group: at most ~29 MB per process), with
#: a reader per shard and thread: at one row group per call (local reads), a footer made from
#: the index per call cost more CPU per token (``loader_throughput.py``'s
#: ``shardflow_local_ixf``: 0.85x the rate, median of 9 interleaved rounds at 50 M tokens;
#: 5-8 % more CPU in two old/new A/Bs at 200 M). Above it, or from an object store (where a
#: footer costs a GET, and the fetched pieces need no copy), footers are made from the index:
#: nothing kept per shard.
LOCAL_FOOTER_GROUPS = 16_384


class TokenReader(ProcessLocal):
    """Reads token ranges through ``storage``; one per process (its footers are not shared).

    ``bytes_read`` and ``groups_read`` count what came from the store, not from ``cache``.
    """

    #: footers read and shards mapped stay in the process that read or mapped them
    _process_local = {"_lock": threading.Lock, "_meta": dict, "_mapped": MappedShards,
                      "_threads": threading.local}

    def __init__(self, store: ReplicaSet, index: RowGroupIndex,
                 cache: ChunkCache | None = None, *, shards: ReplicaSet | None = None,
                 masks: Masks | None = None) -> None:
        self.store = store
        self.index = index
        self.cache = cache
        #: where the shards are: the dataset's own replicas, or a view's source beside them
        #: (:mod:`storage.io.view_store`); the index is always read from ``store``
        self.shards = shards if shards is not None else store
        #: a view's keep-masks (:mod:`storage.format.view`): each decoded row group keeps only
        #: its kept documents' tokens, which the index counts
        self.masks = masks
        self._meta: dict[int, pq.FileMetaData] = {}
        self.bytes_read = 0
        self.groups_read = 0
        self.requests = 0  # GETs of row groups (and footers) made to the store
        #: shards' footers fetched and parsed (each held for the reader's life); none for a
        #: dataset whose index records the shards' codecs (storage.format.chunk_footer)
        self.footers_read = 0
        #: the coalescing window learned from this reader's requests (loaders.prefetch)
        self.coalesce_window: Any = None
        #: holes up to this are read through, not requested separately
        self.hole_bytes = HOLE_BYTES if self.local else REMOTE_HOLE_BYTES
        #: decode under footers made from the index where it records the shards' codecs:
        #: binary token columns (``list<int32>`` ones, from long before, need the footer),
        #: from an object store, or from local disk once the dataset is too large for its
        #: footers to be kept (``LOCAL_FOOTER_GROUPS``)
        self._footerless = (tokens.dtype_of(index.encoding) is not None
                            and (not self.local or len(index) > LOCAL_FOOTER_GROUPS))
        self._mapped = MappedShards()
        self._lock = threading.Lock()
        self._threads = threading.local()  # per read thread: its open mapped shards

    @property
    def makes_footers(self) -> bool:
        """Does a call decode under a footer made for it from the index (the index records the
        shards' codecs, and the dataset is remote or above ``LOCAL_FOOTER_GROUPS``)? Then
        each call has a fixed cost worth sharing among several row groups
        (``loaders.prefetch.LOCAL_COALESCE_WINDOW``)."""
        return self._footerless and self.index.locations(self.store).codec is not None

    @property
    def local(self) -> bool:
        """Are all replicas on local disk (no request cost to coalesce around)?"""
        return all(r.loc.is_local for r in self.shards.replicas)

    def _count(self, nbytes: int, groups: int = 0) -> None:
        with self._lock:
            self.bytes_read += nbytes
            self.groups_read += groups
            self.requests += 1

    def fetch_groups(self, groups: list[int],
                     deliver: Callable[[int, np.ndarray], None] | None = None
                     ) -> dict[int, np.ndarray]:
        """Fetch, verify and decode row groups of ONE shard with as few GETs as possible.

        Object stores charge a round trip per request (~10 ms on a loopback SeaweedFS, more
        across a network), so byte ranges that are close together — neighbouring row groups
        (and, for a shard whose index does not record its codec, the footer when it is not
        cached yet) — are merged into one ranged GET (holes up to ``HOLE_BYTES``, requests up
        to ``MAX_REQUEST_BYTES``). Every piece is still checked against its own digest, and a
        mismatch fails the read over to another replica.

        ``deliver(g, tokens)`` is called as each row group is decoded, in the order of
        ``groups``: a caller waiting for the first one (the first batch from an object store,
        whose first requests take a dozen row groups each) need not wait for the unit's last.
        """
        shard = int(self.index.shard_of[groups[0]])
        where = self.index.locations(self.store)
        path, size = where.paths[shard], int(where.shard_bytes[shard])
        # With the shard's codec in the index the decode needs no footer (one GET and its
        # parsed form fewer per shard and process: storage.format.chunk_footer).
        codec = where.codec_of(shard) if self._footerless else None
        # start, end, key (storage.format.checksums.piece_key: what the piece must hash to), group
        pieces: list[tuple[int, int, str, int | None]] = []
        for g in groups:
            if int(self.index.shard_of[g]) != shard:
                raise ValueError("fetch_groups takes row groups of one shard")
            pieces.append((*where.piece(g), g))
        footer_at = where.footer(shard)
        if not footer_at[2]:  # (only older datasets, or a crafted index, lack it)
            raise ManifestError(f"{path}: manifest lacks footer/row-group locations; "
                                "rebuild the dataset with this version of the pipeline")
        if codec is None and shard not in self._meta:
            pieces.append((*footer_at, None))
        fetched: dict[int, Any] = {}
        #: pieces verified in place in a mapping of the whole shard (a local replica, or the
        #: cache's shard-shaped file), or inside a fetched request's buffer: decoded from it,
        #: at ``(buffer, offset in it)``
        placed: dict[int, tuple[Any, int]] = {}
        missing = pieces
        cache = self.cache
        if cache is not None:
            # Row groups live in the cache's shard-shaped file, decoded from its mapping like a
            # local shard; the footer is an entry of its own.
            in_cache = cache.shard_key(digest_hex(where.shard_sha256, shard))
            missing = []
            for piece in pieces:
                start, end, key, g = piece
                if g is None:
                    data = cache.get(key)
                    if data is not None:
                        fetched[start] = data
                        continue
                else:
                    hit = cache.get_placed(in_cache, size, start, end, key)
                    if hit is not None:
                        placed[start] = (hit, start)
                        continue
                missing.append(piece)
        for request in _coalesce(sorted(missing), self.hole_bytes):
            got, whole, buffer = self._get_verified(path, size, request)
            fetched.update(got)
            if whole is not None:
                placed.update((start, (whole, start)) for start, *_ in request)
            elif codec is not None:  # decoded where it arrived: no copy
                placed.update((start, (buffer, start - request[0][0])) for start, *_ in request)
            if cache is not None:
                for start, _end, key, g in request:
                    if g is None:
                        cache.put(key, got[start])
                    else:
                        cache.put_placed(in_cache, size, start, got[start])
        footer = next((fetched.pop(p[0]) for p in pieces if p[3] is None), None)
        if footer is not None:
            self._meta[shard] = tokens.parse_footer(footer)
            self.footers_read += 1
        group_pieces = [p for p in pieces if p[3] is not None]
        if codec is None:
            meta = self._meta[shard]
            files = self._footer_files(shard, size, group_pieces, fetched, placed, meta)
        else:
            meta, files = self._index_files(path, group_pieces, placed, codec)
        out = {}
        for i, (start, end, _sha, g) in enumerate(group_pieces):
            assert g is not None
            gi = int(self.index.group_of[g])
            number = gi if codec is None else i  # the row group's number in ``meta``
            held = placed.get(start)
            at = held[1] if held is not None else start  # where the piece is in its buffer
            located = tokens.chunk_range(meta, number)
            if located != (at, at + end - start):  # decode only the bytes just verified
                raise IndexFormatError(
                    f"{path}: the footer places row group {gi}'s tokens at bytes "
                    f"[{located[0]:,}, {located[1]:,}), the index verifies [{start:,}, {end:,}) "
                    "(a crafted or damaged index or footer: run `storage verify`)")
            try:
                table = files[start].read(number)
            except (pa.ArrowException, OSError) as exc:  # the footer points past its pieces
                raise IndexFormatError(
                    f"{path}: row group {gi} does not decode from the bytes the index "
                    f"locates and verifies ({exc}; a crafted or damaged index or shard: "
                    "run `storage verify`)") from exc
            out[g] = self._kept(table.column(0), g, path, gi)
            want = int(self.index.starts[g + 1] - self.index.starts[g])
            if len(out[g]) != want:  # the checksum covers the bytes, not the index's count
                raise IndexFormatError(
                    f"{path}: row group {gi} holds {len(out[g]):,} tokens where the index "
                    f"says {want:,} (a crafted or damaged index; run `storage verify`)")
            if held is not None and isinstance(held[0], mmap.mmap):
                MappedShards.release(held[0], held[1], held[1] + end - start)
            if deliver is not None:
                deliver(g, out[g])
        return out

    def _kept(self, column: pa.ChunkedArray, g: int, path: str, gi: int) -> np.ndarray:
        """Row group ``g``'s tokens: a view's only of the documents its mask keeps
        (:func:`storage.format.view.kept_tokens`), a dataset's all."""
        ids = tokens.unpack(column, self.index.encoding)
        if self.masks is None:
            return ids
        rows = int(self.masks.source_rows[g])
        if rows != len(column):  # the mask was made for another row group
            raise IndexFormatError(
                f"{path}: row group {gi} holds {len(column):,} documents where the view's "
                f"masks say {rows:,} (a crafted or damaged view; run `storage verify`)")
        if self.masks.keeps_all(g):  # kept whole (a clustered source's, mostly): no mask
            return ids
        return kept_tokens(ids, tokens.lengths(column, self.index.encoding), self.masks.group(g))

    def _footer_files(self, shard: int, size: int, pieces: list[tuple[int, int, str, Any]],
                      fetched: dict[int, Any], placed: dict[int, tuple[Any, int]],
                      meta: pq.FileMetaData) -> dict[int, TokenChunks]:
        """Per piece, a Parquet reader under the shard's own footer: a mapped shard's (kept
        per thread), or one shard-sized sparse copy holding the fetched pieces (one reader for
        the call: a Python file object serving each row group cost ~0.3 ms of CPU more per
        row group, pyarrow calls back into Python for every read)."""
        held = [(start, fetched[start]) for start, *_ in pieces if start not in placed]
        sparse = TokenChunks(_sparse_shard(size, held), meta) if held else None
        files: dict[int, TokenChunks] = {}
        for start, *_ in pieces:
            if start in placed:
                files[start] = self._mapped_file(shard, placed[start][0], meta)
            else:
                assert sparse is not None
                files[start] = sparse
        return files

    def _index_files(self, path: str, pieces: list[tuple[int, int, str, Any]],
                     placed: dict[int, tuple[Any, int]], codec: int
                     ) -> tuple[pq.FileMetaData, dict[int, TokenChunks]]:
        """A footer for just these pieces (row group ``i`` is ``pieces[i]``, at its offset in
        the buffer it is decoded from: the shard's mapping, or the fetched request's buffer,
        without a copy), made from the index and the pieces' own page headers; and per piece
        its Parquet reader (one per buffer)."""
        chunks = []
        for start, end, _key, g in pieces:
            buffer, offset = placed[start]
            try:
                values, raw = chunk_footer.page_values(
                    memoryview(buffer)[offset:offset + end - start])
            except chunk_footer.ChunkFormatError as exc:
                raise IndexFormatError(
                    f"{path}: row group {int(self.index.group_of[g])}'s token chunk "
                    f"[{start:,}, {end:,}): {exc} (a crafted or damaged index or shard: run "
                    "`storage verify`)") from None
            chunks.append((offset, end - start, values, raw))
        meta = chunk_footer.metadata(chunks, codec)
        readers: dict[int, TokenChunks] = {}
        files = {}
        for start, *_ in pieces:
            buffer = placed[start][0]
            reader = readers.get(id(buffer))
            if reader is None:
                reader = readers[id(buffer)] = TokenChunks(buffer, meta)
            files[start] = reader
        return meta, files

    def _mapped_file(self, shard: int, whole: Any, meta: pq.FileMetaData) -> TokenChunks:
        """This thread's Parquet reader over a mapped shard, made once per shard and thread.

        A Parquet reader made per row group cost ~80 us of each one's ~680 us decode (0.3
        CPU-s per billion tokens). One per thread, not shared: a Parquet reader's pre-buffering
        state is not safe to use from two threads at once. At most ``MappedShards.limit`` per
        thread (each keeps its mapping alive); they go with the thread."""
        files = getattr(self._threads, "files", None)
        if files is None:
            files = self._threads.files = OrderedDict()
        held = files.get(shard)
        if held is not None and held[0] is whole:
            files.move_to_end(shard)
            return held[1]
        parquet = TokenChunks(whole, meta)
        files[shard] = (whole, parquet)
        while len(files) > max(1, self._mapped.limit):
            files.popitem(last=False)
        return parquet

    def _get_verified(self, path: str, size: int,
                      pieces: list[tuple[int, int, str, int | None]]
                      ) -> tuple[dict[int, Any], Any, memoryview]:
        """The pieces, verified, by start; the whole mapped shard when it is local; and the
        request's bytes (``pieces[0]``'s start is their first)."""
        lo, hi = pieces[0][0], max(p[1] for p in pieces)

        def fetch(loc) -> tuple[dict[int, Any], Any, memoryview]:  # type: ignore[no-untyped-def]
            whole = None
            if loc.is_local:  # mapped: verified in place, no copy
                try:
                    whole = self._mapped.get(loc.path(path), size, loc.root)
                except UnsafePathError as exc:  # this copy's problem: try another replica
                    raise InvalidObjectError(exc) from exc
                data = memoryview(whole)[lo:hi]
            else:  # a zero-copy buffer from obstore (bytes from others); pieces are views
                data = memoryview(read_range(loc.fs, loc.path(path), lo, hi))
            if len(data) != hi - lo:
                raise ChecksumMismatchError(f"{path}[{lo}:{hi}]: {len(data)} bytes returned, "
                                            f"the index says {hi - lo} (a shorter object)")
            out = {}
            for start, end, key, _g in pieces:
                piece = data[start - lo:end - lo]
                if not piece_matches(key, piece):
                    raise ChecksumMismatchError(
                        f"{path}[{start}:{end}] does not match its checksum "
                        f"{key[:15]}... in the index (a corrupt or different copy)")
                out[start] = piece
            return out, whole, data

        result = self.shards.read(path, fetch, f"{path}[{lo}:{hi}]")
        self._count(hi - lo, sum(1 for p in pieces if p[3] is not None))
        return result
