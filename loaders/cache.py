"""A local disk cache of verified shard pieces, shared by every process on one host.

What it holds: the byte ranges that :class:`loaders.reader.TokenReader` fetches from the store
(row-group token column chunks and shard footers), each stored under the digest that the
manifest gives for it. Why that key: the manifest already names every piece by its content, so

- a hit can never be a stale piece of another object or of an older version of the dataset (a
  rebuilt shard has new checksums, hence new keys), and nothing needs invalidating;
- several datasets, ranks and DataLoader workers on one host can share one directory;
- every read is re-verified for free against its own name: a file that rotted, was torn by a
  crash or was edited is deleted and reported as a miss, so the reader refetches it from the
  store and never decodes bad bytes.

Row groups are kept differently from the rest (:meth:`ChunkCache.get_placed`): in one file per
shard (named ``s-<the shard's sha256>``), shaped like the shard and sparse, each piece at its
own offset, so that a warm read is a local read: the file is memory-mapped once, each piece
verified in place and decoded by pyarrow straight from the mapping. A piece held in memory has
to be decoded through a Python file object, and pyarrow then calls back into Python for its
bytes (an I/O-thread hand-off and a GIL acquisition per row group): ~0.8 CPU-s per billion
tokens and ~14 % of the rate on 2 cores. A piece is written in place (``pwrite``) under the
lock; a reader that meets a half-written one takes it for a miss. Entry sizes are what they
take on disk (allocated blocks for the sparse files).

Other entries (footers, index columns) are written to a temporary file in the cache's own
``tmp/`` and renamed into place
(``os.replace`` is atomic on one filesystem), so readers see a whole entry or none. The size
limit is kept with a byte counter in ``.size``, changed only under an exclusive ``flock`` on
``.lock`` together with the rename or delete it accounts for: when a write would take the total
over ``max_bytes``, the directory is scanned and least-recently-used entries (by mtime, which a
hit touches; a shard file goes whole) are deleted until the new entry fits under ``LOW_WATER``
of the limit, before the rename or write (so the limit holds at every instant), so a full cache
rescans once per ~10 % of its size written rather than on every write. Entries are not
fsync'ed: after a power loss a torn entry fails verification and is refetched, which is all a
cache owes.

Failures of the cache itself (disk full, read-only directory) never fail a read: they count in
``errors`` and the piece comes from the store. This module imports neither torch nor the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infra.process.local import ProcessLocal
from storage.format.checksums import piece_matches

#: Default size limit: room for a mid-sized dataset's token chunks on a trainer's local disk;
#: pass ``cache_bytes`` for more or less.
DEFAULT_CACHE_BYTES = 16 << 30
#: After eviction the cache holds at most this fraction of ``max_bytes``.
LOW_WATER = 0.9
#: Temporary files older than this are leftovers of a killed process and are removed on scans.
STALE_TMP_S = 3600.0

#: a sha256 in hex, or its first 32 hex digits (the row-group digests of a binary index),
#: either prefixed ``b3-`` for BLAKE3 (``storage.format.checksums.piece_key``); or ``s-`` and a
#: shard's sha256: the shard-shaped file its row groups are placed in (:meth:`put_placed`)
_KEY = re.compile(r"^(?:(?:b3-)?[0-9a-f]{32}(?:[0-9a-f]{32})?|s-[0-9a-f]{64})$")
#: shard files kept mapped per process (a mapping is reused for every row group of a shard)
MAPPED_SHARDS = 64
#: a shard file read through a held mapping has its mtime (its LRU age) renewed this often
TOUCH_EVERY_S = 60.0
_SIZE_FILE = ".size"
_LOCK_FILE = ".lock"
_TMP_DIR = "tmp"


@dataclass(frozen=True)
class Entry:
    """One cached piece as a scan sees it."""

    key: str
    size: int
    used: float  # mtime: the write, or the last hit


def choose_evictions(entries: Iterable[Entry], target_bytes: int) -> list[str]:
    """Keys to delete, least recently used first, until the rest fits in ``target_bytes``.

    Pure (no I/O) so the policy is tested apart from the files. The entry being written is
    not among ``entries`` (room is made before it is renamed into place), so what was just
    paid for is never evicted.
    """
    entries = list(entries)
    total = sum(e.size for e in entries)
    chosen: list[str] = []
    for entry in sorted(entries, key=lambda e: (e.used, e.key)):
        if total <= target_bytes:
            break
        chosen.append(entry.key)
        total -= entry.size
    return chosen


class ChunkCache(ProcessLocal):
    """Verified pieces by digest in ``directory``, at most ``max_bytes`` of them."""

    #: reader threads share one lock for the counters; mappings stay in their process
    _process_local = {"_counts": threading.Lock, "_maps": OrderedDict}

    def __init__(self, directory: str | os.PathLike[str],
                 max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"cache size limit must be >= 1 byte, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        (self.directory / _TMP_DIR).mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.corrupt = 0
        self.errors = 0
        self._counts = threading.Lock()  # reader threads share one cache object
        #: shard files mapped by this process: key -> (inode, mapping, last mtime touch),
        #: most recent last
        self._maps: OrderedDict[str, tuple[int, mmap.mmap, float]] = OrderedDict()

    def _add(self, **counts: int) -> None:
        with self._counts:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    @staticmethod
    def cacheable(key: str) -> bool:
        """Only a digest in hex (or its first 128 bits), tagged with its algorithm, becomes a
        file name (a manifest cannot steer paths)."""
        return bool(_KEY.match(key))

    def path(self, key: str) -> Path:
        return self.directory / key.removeprefix("b3-").removeprefix("s-")[:2] / key

    @staticmethod
    def shard_key(shard_sha256: str) -> str:
        """The key of the shard-shaped file that holds a shard's cached row groups."""
        return "s-" + shard_sha256

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The piece named ``key`` if cached and intact, else ``None`` (a miss)."""
        if not self.cacheable(key):
            return None
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._add(misses=1)
            return None
        except OSError:
            self._add(misses=1, errors=1)
            return None
        if not piece_matches(key, data):
            self._discard(path)
            self._add(misses=1, corrupt=1)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to be evicted
        self._add(hits=1)
        return data

    def get_placed(self, shard: str, size: int, start: int, end: int, key: str
                   ) -> mmap.mmap | None:
        """The mapped cached copy of a shard when it holds the piece ``[start, end)`` intact
        (verified in place against ``key``), else ``None`` (a miss).

        Row groups are cached in a file shaped like their shard (``shard``:
        :meth:`shard_key`; ``size`` bytes, sparse: only the pieces ever fetched take disk
        space), each at its own offset. So a hit is read exactly like a shard on local disk:
        verified in place and decoded by pyarrow straight from the mapping, one mapping per
        shard and process, with no copy and no call back into Python. A range never written
        reads as zeros: a miss. Other bytes there (rot, a torn write) count as corrupt and the
        piece is fetched and written again over them.
        """
        if not self.cacheable(shard) or not self.cacheable(key):
            return None
        mapped = self._mapping(shard, size)
        if mapped is not None and end <= size:
            piece = memoryview(mapped)[start:end]
            if piece_matches(key, piece):
                self._add(hits=1)
                return mapped
            if np.frombuffer(piece, dtype=np.uint8).any():  # not a hole: other bytes
                self._add(corrupt=1)
        self._add(misses=1)
        return None

    def _mapping(self, shard: str, size: int) -> mmap.mmap | None:
        path = self.path(shard)
        try:
            st = os.stat(path)
        except OSError:
            return None
        if st.st_size != size or not size:
            return None  # written for another size: not this shard's (put_placed replaces it)
        touch, mapped = False, None
        with self._counts:
            held = self._maps.get(shard)
            if held is not None and held[0] == st.st_ino:
                self._maps.move_to_end(shard)
                mapped, now = held[1], time.time()
                if now - held[2] > TOUCH_EVERY_S:
                    self._maps[shard] = (held[0], mapped, now)
                    touch = True
        if mapped is not None:
            if touch:
                with contextlib.suppress(OSError):
                    os.utime(path)  # still in use: renew its LRU age
            return mapped
        try:
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size != size:
                    return None
                mapped = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
            with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: still mapped
                os.utime(path)  # recently used: the last to be evicted
        except FileNotFoundError:  # evicted (by another job) since the stat: a miss
            return None
        except OSError:
            self._add(errors=1)
            return None
        with self._counts:
            self._maps[shard] = (st.st_ino, mapped, time.time())
            while len(self._maps) > MAPPED_SHARDS:
                self._maps.popitem(last=False)
        return mapped

    def put_placed(self, shard: str, size: int, start: int, data: bytes | memoryview) -> None:
        """Write a verified piece at its offset in the shard-shaped file ``shard`` (made,
        sparse, at ``size`` bytes when missing); never raises ``OSError``. Concurrent writers
        of one piece write the same bytes; a reader that sees a half-written piece takes it
        for a miss and fetches it."""
        room = len(data) + 2 * _BLOCK
        if (not self.cacheable(shard) or room > self.max_bytes * LOW_WATER
                or start < 0 or start + len(data) > size):
            return
        path = self.path(shard)
        try:
            path.parent.mkdir(exist_ok=True)
            with self._locked():
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # the umask applies
                try:
                    st = os.fstat(fd)
                    before = _disk_bytes(st)
                    total = self._read_total()
                    if st.st_size != size:  # new, or another size (not this shard's): restart
                        os.ftruncate(fd, 0)
                        os.ftruncate(fd, size)
                        emptied = _disk_bytes(os.fstat(fd))
                        total += emptied - before
                        before = emptied
                    if total + room > self.max_bytes:
                        total = self._evict(room=room, keep=shard)
                    os.pwrite(fd, data, start)
                    total += _disk_bytes(os.fstat(fd)) - before
                finally:
                    os.close(fd)
                self._write_total(max(0, total))
        except OSError:
            self._add(errors=1)

    # -- writes ------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        """Store a piece the caller has verified against ``key``; never raises ``OSError``."""
        if not self.cacheable(key) or len(data) > self.max_bytes * LOW_WATER:
            return
        if self.path(key).exists():
            return  # another process (a rank missing at the same time) got there first
        tmp = self.directory / _TMP_DIR / f"{key}.{os.getpid()}.{secrets.token_hex(6)}"
        try:
            tmp.write_bytes(data)
            size = _disk_bytes(tmp.stat())
            path = self.path(key)
            path.parent.mkdir(exist_ok=True)
            with self._locked():
                # Room is made before the rename, so that the directory is under the limit at
                # every instant, also for a reader scanning it without the lock.
                total = self._read_total() - _size_or_zero(path) + size
                if total > self.max_bytes:
                    total = self._evict(room=size) + size
                os.replace(tmp, path)
                self._write_total(total)
        except OSError:
            self._add(errors=1)
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _discard(self, path: Path) -> None:
        try:
            with self._locked():
                if path.exists():
                    total = self._read_total() - _size_or_zero(path)
                    path.unlink()
                    self._write_total(max(0, total))
        except OSError:
            self._add(errors=1)

    # -- bookkeeping (callers hold the lock) -------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # One open file per call: flock then excludes other threads of this process as well.
        with open(self.directory / _LOCK_FILE, "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read_total(self) -> int:
        try:
            return int((self.directory / _SIZE_FILE).read_text())
        except (OSError, ValueError):
            return sum(e.size for e in self.scan())  # first use, or a lost counter

    def _write_total(self, total: int) -> None:
        tmp = self.directory / _TMP_DIR / f"{_SIZE_FILE}.{os.getpid()}.{secrets.token_hex(6)}"
        tmp.write_text(str(total))
        os.replace(tmp, self.directory / _SIZE_FILE)

    def scan(self) -> list[Entry]:
        """Every entry on disk (and stale temporary files removed)."""
        entries = []
        for sub in self.directory.iterdir():
            if sub.name == _TMP_DIR:
                _remove_stale(sub)
                continue
            if len(sub.name) != 2 or not sub.is_dir():
                continue
            for item in os.scandir(sub):
                if not self.cacheable(item.name):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = item.stat()
                    entries.append(Entry(item.name, _disk_bytes(st), st.st_mtime))
        return entries

    def _evict(self, room: int, keep: str | None = None) -> int:
        """Delete least-recently-used entries (never ``keep``, the file being written) until
        ``room`` more bytes stay under the low-water mark; the total of what is left."""
        entries = self.scan()
        total = sum(e.size for e in entries)
        sizes = {e.key: e.size for e in entries}
        kept = sizes.get(keep, 0) if keep else 0
        candidates = [e for e in entries if e.key != keep]
        for key in choose_evictions(candidates, int(self.max_bytes * LOW_WATER) - room - kept):
            with contextlib.suppress(FileNotFoundError):
                self.path(key).unlink()
                self._add(evictions=1)
            total -= sizes[key]
        return total

    def total_bytes(self) -> int:
        """Bytes of all entries, counted on disk (for tests and inspection), under the lock: a
        directory listing is not atomic, and one taken while an entry is evicted and another
        renamed in can list both."""
        with self._locked():
            return sum(e.size for e in self.scan())

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "corrupt": self.corrupt, "errors": self.errors}


#: st_blocks' unit
_BLOCK = 4096


def _disk_bytes(st: os.stat_result) -> int:
    """What an entry costs on disk: its allocated blocks for a sparse shard file, its size for
    a small one (whose last block is mostly empty)."""
    return min(st.st_size, st.st_blocks * 512)


def _size_or_zero(path: Path) -> int:
    try:
        return _disk_bytes(path.stat())
    except FileNotFoundError:
        return 0


def _remove_stale(tmp_dir: Path) -> None:
    cutoff = time.time() - STALE_TMP_S
    for item in os.scandir(tmp_dir):
        with contextlib.suppress(OSError):
            if item.stat().st_mtime < cutoff:
                os.unlink(item.path)
