"""The row-group arrays of a large index, shared by every process of a host, not copied.

At 10 M row groups a rank's per-row-group arrays (token offsets ``starts``, samples per row
group, first sample of each; plus ``first_group`` per shard) are ~175 MB; a node of 8 ranks
that each builds its own holds 8 copies. Instead the first process to open a dataset writes
them once to a local file, ``<dir>/shardflow-index-<index sha256[:16]>-<name>.bin`` (a
temporary file renamed into place: atomic; a reader never sees half a file), and every
process memory-maps it: the pages are the host's page cache, held once however many ranks map
them, and a process has resident only the pages it touches (the checksum is computed by
reading the file, not through the mapping): a rank's plan reads the samples per row group (1
byte each at the default sizes), the other arrays are looked up at the rank's own row groups.

The arrays are built only from index columns verified against the manifest (their sha256);
the file carries the BLAKE3 of its payload, checked on every open, so a corrupt or truncated
copy is detected, replaced from the store and counted (``corrupt``). ``dir``: the loader's
``cache_dir`` when set, else ``$SHARDFLOW_INDEX_DIR``, else the temporary directory.
Indexes under ``MIN_INDEX_BYTES`` (~230,000 row groups) are not worth a file and stay in
process memory.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import tempfile
from collections.abc import Callable

import blake3
import numpy as np

MAGIC = b"SFIDXv1\n"
#: a smaller index object: its arrays are built in process memory as before
MIN_INDEX_BYTES = 8 << 20
ENV_DIR = "SHARDFLOW_INDEX_DIR"

corrupt = 0  # copies found corrupt and replaced, this process


def index_dir(cache_dir: str | None = None) -> str:
    if cache_dir:
        return os.path.join(cache_dir, "index")
    return os.environ.get(ENV_DIR) or tempfile.gettempdir()


def _encode(arrays: dict[str, np.ndarray]) -> tuple[bytes, list[memoryview]]:
    """The header and the payload's pieces (views of the arrays: nothing copied)."""
    entries, parts, offset = [], [], 0
    digest = blake3.blake3()
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        entries.append({"name": name, "dtype": arr.dtype.str, "offset": offset,
                        "count": int(arr.size)})
        data = memoryview(arr.reshape(-1).view(np.uint8))
        pad = memoryview(b"\0" * (-len(data) % 8))  # every array 8-byte aligned in the file
        for piece in (data, pad):
            digest.update(piece)
            parts.append(piece)
        offset += len(data) + len(pad)
    head = json.dumps({"arrays": entries, "payload": offset,
                       "blake3": digest.hexdigest()}).encode()
    head += b" " * (-(len(MAGIC) + 8 + len(head)) % 8)
    return MAGIC + len(head).to_bytes(8, "little") + head, parts


#: the payload is hashed through a buffer this big, read from the file, not through the
#: mapping: checking a copy must not make every page of it resident in the process
READ_BYTES = 4 << 20


def _payload_blake3(fd: int, start: int, size: int) -> str:
    digest = blake3.blake3(max_threads=blake3.blake3.AUTO)
    buf = bytearray(min(READ_BYTES, max(1, size - start)))
    view = memoryview(buf)
    at = start
    while at < size:
        got = os.preadv(fd, [view[:min(len(buf), size - at)]], at)
        if got <= 0:
            raise ValueError("short read")
        digest.update(view[:got])
        at += got
    return digest.hexdigest()


def _open(path: str) -> dict[str, np.ndarray]:
    """The arrays of ``path``, mapped read-only; ValueError when the file is not whole.

    The payload's BLAKE3 is checked by reading the file (the pages go through the host's
    page cache, not into this process's resident set); only the pages a process then uses
    are resident in it."""
    with open(path, "rb") as fh:
        fd = fh.fileno()
        size = os.fstat(fd).st_size
        first = os.pread(fd, min(size, 1 << 16), 0)
        if len(first) < len(MAGIC) + 8 or first[:len(MAGIC)] != MAGIC:
            raise ValueError("not an index copy")
        n = int.from_bytes(first[len(MAGIC):len(MAGIC) + 8], "little")
        start = len(MAGIC) + 8 + n
        raw = first[len(MAGIC) + 8:start] if start <= len(first) else os.pread(
            fd, n, len(MAGIC) + 8)
        try:
            head = json.loads(raw)
        except ValueError as exc:
            raise ValueError("header unreadable") from exc
        if size != start + head["payload"]:
            raise ValueError("size differs from the header's")
        # Mapped before the check, from the same open file: what was checked is what is used
        # (the copy is replaced only by a rename, never rewritten in place).
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        if _payload_blake3(fd, start, size) != head["blake3"]:
            raise ValueError("payload checksum differs")
    out = {}
    for e in head["arrays"]:
        out[e["name"]] = np.frombuffer(mapped, dtype=np.dtype(e["dtype"]), count=e["count"],
                                       offset=start + e["offset"])
    return out


def shared_arrays(directory: str, key: str,
                  build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays ``build()`` makes, from this host's copy ``key`` in ``directory`` (written
    by the first process that needs it, checked on every open), memory-mapped read-only."""
    path = os.path.join(directory, f"shardflow-index-{key}.bin")
    try:
        os.makedirs(directory, exist_ok=True)
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return build()  # no writable local directory: private arrays
    try:
        # The ranks of a node start together: one builds and writes, the others wait for it
        # and map its file (else each would map its own copy, renamed over the others).
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _shared(path, directory, build)
    finally:
        os.close(lock)  # releases the lock


def _shared(path: str, directory: str,
            build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    global corrupt
    if os.path.exists(path):
        try:
            return _open(path)
        except (OSError, ValueError, KeyError):
            corrupt += 1  # replaced below with arrays built from the verified index
    arrays = build()
    head, parts = _encode(arrays)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".shardflow-index-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(head)
                for p in parts:
                    fh.write(p)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return _open(path)
    except (OSError, ValueError):
        return arrays  # the copy could not be written or read back: private arrays
