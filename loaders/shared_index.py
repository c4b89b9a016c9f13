"""The row-group arrays of a large index, shared by every process of a host, not copied.

At 10 M row groups a rank's per-row-group arrays (token offsets ``starts``, samples per row
group, first sample of each; plus ``first_group`` per shard) are ~175 MB; a node of 8 ranks
that each builds its own holds 8 copies. Instead the first process to open a dataset writes
them once to a local file, ``<dir>/shardflow-index-<euid>/shardflow-index-<index
sha256[:16]>-<name>.bin`` (a temporary file renamed into place: atomic; a reader never sees
half a file), and every process memory-maps it: the pages are the host's page cache, held once
however many ranks map them, and a process has resident only the pages it touches (the
checksum is computed by reading the file, not through the mapping): a rank's plan reads the
samples per row group (1 byte each at the default sizes), the other arrays are looked up at
the rank's own row groups.

**Whom a copy is trusted from: this user only.** ``dir`` is the temporary directory by
default, which every local user can write, and a copy's name follows from the public index
sha256: a copy another user wrote first (self-consistent: its checksum is in its own header)
made a root loader train on another index's 0-0.04 % of the data, a ``.lock`` they held
blocked it, and truncating a mapped copy killed it with SIGBUS. So the copies live in a folder
of this user's own, ``shardflow-index-<euid>``, opened without following a link and checked
on the open descriptor (a directory, owned by the effective uid, mode 0700; every later call
is relative to that descriptor, so renaming the path away changes nothing), and each file in
it is checked the same way before it is read or mapped (a regular file owned by us, writable
by no group or other user; else it is rebuilt). No other user can create, change, lock or
truncate anything in it. When the folder itself fails (another user's, a link, a file), the
arrays are built in process memory, with a warning naming it (:data:`refused` counts them).

The arrays are built only from index columns verified against the manifest (their sha256);
the file carries the BLAKE3 of its payload, checked on every open, so a corrupt or truncated
copy is detected, replaced from the store and counted (``corrupt``). The caller's ``check``
then compares the mapped arrays with the manifest's totals (lengths and ends: a few pages),
which a copy of any other index fails. A full comparison with the index would mean building
the arrays again, which is what the copy is there to avoid (measured at 2 M row groups, a
fresh process: building them 35-43 ms and 48 MB private, opening the copy with its checks
13-15 ms and 3.8 MB, as before the checks). ``dir``: the loader's
``cache_dir`` when set, else ``$SHARDFLOW_INDEX_DIR``, else the temporary directory.
Indexes under ``MIN_INDEX_BYTES`` (~230,000 row groups) are not worth a file and stay in
process memory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import stat
import tempfile
from collections.abc import Callable

import blake3
import numpy as np

from infra import environment

MAGIC = b"SFIDXv1\n"
#: a smaller index object: its arrays are built in process memory as before
MIN_INDEX_BYTES = 8 << 20
ENV_DIR = "SHARDFLOW_INDEX_DIR"

corrupt = 0  # copies found corrupt (or not matching the manifest) and replaced, this process
refused = 0  # copies and folders refused for who owns them or may write them, this process

log = logging.getLogger(__name__)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedCopy(OSError):
    """A folder or file that another user owns or may write (or a link in its place)."""


def index_dir(cache_dir: str | None = None) -> str:
    if cache_dir:
        return os.path.join(cache_dir, "index")
    return environment.value(ENV_DIR) or tempfile.gettempdir()


def private_folder(directory: str) -> str:
    """This user's folder of copies in ``directory`` (it need not exist)."""
    return os.path.join(directory, f"shardflow-index-{os.geteuid()}")


def _owned(fd: int, what: str, kind: Callable[[int], bool]) -> os.stat_result:
    """``fstat(fd)`` when it is a ``kind`` (``stat.S_ISDIR``/``S_ISREG``) owned by this
    process's effective uid; :class:`UntrustedCopy` naming ``what`` otherwise."""
    st = os.fstat(fd)
    if not kind(st.st_mode):
        raise UntrustedCopy(f"{what}: not a {'directory' if kind is stat.S_ISDIR else 'file'}")
    if st.st_uid != os.geteuid():
        raise UntrustedCopy(f"{what}: owned by uid {st.st_uid}, not by this user "
                            f"({os.geteuid()})")
    return st


def _open_folder(directory: str) -> int:
    """A descriptor of :func:`private_folder` (made 0700 when absent), checked: a directory (not
    a link to one), ours, mode 0700 (an own folder with more bits is made 0700: nobody else
    can have put a file of ours in it, and files of others are refused one by one)."""
    os.makedirs(directory, exist_ok=True)
    folder = private_folder(directory)
    base = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        name = os.path.basename(folder)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=base)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=base)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UntrustedCopy(f"{folder}: a symbolic link or a file, not a folder") from None
            raise
    finally:
        os.close(base)
    try:
        st = _owned(fd, folder, stat.S_ISDIR)
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(folder: int, name: str, flags: int, where: str, mode: int = 0o600) -> int:
    """``name`` in the folder ``folder``, opened without following a link and checked: a
    regular file, ours, writable by no group or other user. :class:`UntrustedCopy` otherwise.
    (Opened non-blocking: a FIFO in its place would block a read-only open until a writer
    came; a regular file reads the same.)"""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode,
                     dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedCopy(f"{where}: a symbolic link") from None
        raise
    try:
        st = _owned(fd, where, stat.S_ISREG)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UntrustedCopy(f"{where}: writable by group or others "
                                f"(mode {stat.S_IMODE(st.st_mode):o})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def expect(lengths: dict[str, int], last: dict[str, int] | None = None
           ) -> Callable[[dict[str, np.ndarray]], None]:
    """A ``check`` for :func:`shared_arrays`: each array's length, and the last value of those in
    ``last`` (what the manifest's totals say; a page or two read, whatever the size)."""
    def check(arrays: dict[str, np.ndarray]) -> None:
        for name, n in lengths.items():
            if len(arrays[name]) != n:
                raise ValueError(f"{name}: {len(arrays[name])} entries, the manifest says {n}")
        for name, value in (last or {}).items():
            if int(arrays[name][-1]) != value:
                raise ValueError(f"{name} ends at {int(arrays[name][-1])}, the manifest says "
                                 f"{value}")
    return check


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


def _open(folder: int, name: str, where: str) -> dict[str, np.ndarray]:
    """The arrays of the copy ``name``, mapped read-only once it passes :func:`_open_file`'s
    checks; ValueError when the file is not whole, :class:`UntrustedCopy` when it is not ours.

    The payload's BLAKE3 is checked by reading the file (the pages go through the host's
    page cache, not into this process's resident set); only the pages a process then uses
    are resident in it."""
    fd = _open_file(folder, name, os.O_RDONLY, where)
    with open(fd, "rb"):  # closes fd
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
        # (the copy is replaced only by a rename, never rewritten in place, and no other user
        # can open it: nobody but this user can truncate it under the mapping).
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        if _payload_blake3(fd, start, size) != head["blake3"]:
            raise ValueError("payload checksum differs")
    out = {}
    for e in head["arrays"]:
        out[e["name"]] = np.frombuffer(mapped, dtype=np.dtype(e["dtype"]), count=e["count"],
                                       offset=start + e["offset"])
    return out


def shared_arrays(directory: str, key: str, build: Callable[[], dict[str, np.ndarray]],
                  check: Callable[[dict[str, np.ndarray]], None] | None = None
                  ) -> dict[str, np.ndarray]:
    """The arrays ``build()`` makes, from this host's copy ``key`` in this user's folder in
    ``directory`` (written by the first process that needs it, checked on every open),
    memory-mapped read-only. ``check(arrays)`` raises ValueError when a copy's arrays cannot be
    the ones ``build`` makes (the manifest's totals): such a copy is replaced."""
    global refused
    name = f"shardflow-index-{key}.bin"
    try:
        folder = _open_folder(directory)
    except UntrustedCopy as exc:
        refused += 1
        log.warning("%s; the index's arrays stay in this process's memory (remove it, or set "
                    "the loader's cache_dir or $%s to a folder of your own)", exc, ENV_DIR)
        return build()
    except OSError:
        return build()  # no writable local directory: private arrays
    try:
        where = os.path.join(private_folder(directory), name)
        try:
            lock = _lock_file(folder, name + ".lock", where + ".lock")
        except OSError:
            return build()
        try:
            # The ranks of a node start together: one builds and writes, the others wait for
            # it and map its file (else each would map its own copy, renamed over the others).
            fcntl.flock(lock, fcntl.LOCK_EX)
            return _shared(folder, name, where, build, check)
        finally:
            os.close(lock)  # releases the lock
    finally:
        os.close(folder)


def _lock_file(folder: int, name: str, where: str) -> int:
    """The lock file, ours (one that fails :func:`_open_file`'s checks is replaced)."""
    global refused
    try:
        return _open_file(folder, name, os.O_RDWR | os.O_CREAT, where)
    except UntrustedCopy:
        refused += 1
        os.unlink(name, dir_fd=folder)
        return _open_file(folder, name, os.O_RDWR | os.O_CREAT, where)


def _shared(folder: int, name: str, where: str, build: Callable[[], dict[str, np.ndarray]],
            check: Callable[[dict[str, np.ndarray]], None] | None) -> dict[str, np.ndarray]:
    global corrupt, refused
    try:
        arrays = _open(folder, name, where)
        if check is not None:
            check(arrays)
        return arrays
    except FileNotFoundError:
        pass
    except UntrustedCopy as exc:
        refused += 1  # replaced below, by a rename over it (a link itself, not its target)
        log.warning("%s; replaced by a copy of this user's own", exc)
    except (OSError, ValueError, KeyError, TypeError):
        corrupt += 1  # replaced below with arrays built from the verified index
    arrays = build()
    head, parts = _encode(arrays)
    tmp = f".{name}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(head)
                for p in parts:
                    fh.write(p)
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            os.unlink(tmp, dir_fd=folder)
            raise
        return _open(folder, name, where)
    except (OSError, ValueError):
        return arrays  # the copy could not be written or read back: private arrays
