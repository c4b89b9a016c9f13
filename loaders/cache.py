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

Writes go to a temporary file in the cache's own ``tmp/`` and are renamed into place
(``os.replace`` is atomic on one filesystem), so readers see a whole entry or none. The size
limit is kept with a byte counter in ``.size``, changed only under an exclusive ``flock`` on
``.lock`` together with the rename or delete it accounts for: when a write would take the total
over ``max_bytes``, the directory is scanned and least-recently-used entries (by mtime, which a
hit touches) are deleted until the new entry fits under ``LOW_WATER`` of the limit, before the
rename (so the limit holds at every instant), so a full cache rescans once per ~10 %
of its size written rather than on every write. Entries are not fsync'ed: after a power loss a
torn entry fails verification and is refetched, which is all a cache owes.

Failures of the cache itself (disk full, read-only directory) never fail a read: they count in
``errors`` and the piece comes from the store. This module imports neither torch nor the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.checksums import piece_matches

#: Default size limit: room for a mid-sized dataset's token chunks on a trainer's local disk;
#: pass ``cache_bytes`` for more or less.
DEFAULT_CACHE_BYTES = 16 << 30
#: After eviction the cache holds at most this fraction of ``max_bytes``.
LOW_WATER = 0.9
#: Temporary files older than this are leftovers of a killed process and are removed on scans.
STALE_TMP_S = 3600.0

#: a sha256 in hex, or its first 32 hex digits (the row-group digests of a binary index),
#: either prefixed ``b3-`` for BLAKE3 (``storage.checksums.piece_key``)
_KEY = re.compile(r"^(?:b3-)?[0-9a-f]{32}(?:[0-9a-f]{32})?$")
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


class ChunkCache:
    """Verified pieces by digest in ``directory``, at most ``max_bytes`` of them."""

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

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_counts")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._counts = threading.Lock()

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
        return self.directory / key.removeprefix("b3-")[:2] / key

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
            path = self.path(key)
            path.parent.mkdir(exist_ok=True)
            with self._locked():
                # Room is made before the rename, so that the directory is under the limit at
                # every instant, also for a reader scanning it without the lock.
                total = self._read_total() - _size_or_zero(path) + len(data)
                if total > self.max_bytes:
                    total = self._evict(room=len(data)) + len(data)
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
                    entries.append(Entry(item.name, st.st_size, st.st_mtime))
        return entries

    def _evict(self, room: int) -> int:
        """Delete least-recently-used entries until ``room`` more bytes stay under the
        low-water mark; the total of what is left."""
        entries = self.scan()
        total = sum(e.size for e in entries)
        sizes = {e.key: e.size for e in entries}
        for key in choose_evictions(entries, int(self.max_bytes * LOW_WATER) - room):
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


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _remove_stale(tmp_dir: Path) -> None:
    cutoff = time.time() - STALE_TMP_S
    for item in os.scandir(tmp_dir):
        with contextlib.suppress(OSError):
            if item.stat().st_mtime < cutoff:
                os.unlink(item.path)
