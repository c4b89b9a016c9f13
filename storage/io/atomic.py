"""Atomic, durable writes of one object: a temporary file renamed over (local), a PUT or a
server-side copy (object stores); hard links instead of second copies; the writeback hint for
scratch. Every writer of the project (replicas, the lease, markers, repair) writes through
:func:`write_atomic`."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from storage.format.layout import UnsafePathError
from storage.io.local import paths as local_paths
from storage.io.retry import PERMANENT, classify
from storage.io.urls import Location


def process_umask() -> int:
    """The process umask, read without changing it (``os.umask`` can only set it, which would
    race with other threads creating files); falls back to set-and-restore elsewhere."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: what an object is written from: its bytes, or a local file holding them (an object too big
#: to hold in memory: a 100 TB dataset's row-group index is ~3 GB), read as it is sent
Payload = bytes | Path


def payload_size(data: Payload) -> int:
    return data.stat().st_size if isinstance(data, Path) else len(data)


def write_atomic(loc: Location, relative: str, data: Payload, same_as: str | None = None,
                 sync: bool = True) -> None:
    """Write one object so that readers see either nothing or all of it.

    An object-store PUT is atomic by itself; on a local or network filesystem we write a
    temporary file next to the target and rename it over, which POSIX makes atomic. The file
    gets the mode a plain ``open`` would give (0666 less the umask: 0644 under the usual 022),
    so a training job running as another user on a shared filesystem can read the dataset.

    ``same_as``: another object at ``loc`` known to hold exactly ``data`` (the caller verified
    it). On a local filesystem the new name is then a hard link to it, renamed into place the
    same way: no second copy of the bytes written and synced (a pipeline's phase 2 moves every
    shard that lost no row to dedup this way). On an object store it is a server-side copy
    (S3 ``CopyObject``), atomic like a PUT, so the bytes do not travel through this process a
    second time. Where links or copies are refused (another device, a filesystem without
    them, a store without a copy call, a missing source) the bytes are written as usual.

    ``sync`` (local filesystems; an object store's PUT is durable when it returns): the file's
    bytes, and its name in the folder, are on disk when this returns, so a power loss after a
    commit cannot leave the manifest naming a missing or torn file. ``False`` is for scratch
    that is verified before reuse (a pipeline's ``_work/``): the write does not wait for the
    disk, and a crash costs a redo. The disk write is started at once all the same
    (:func:`start_writeback`): a work file linked into the dataset later is synced then, and
    finds little left to write.

    On a local filesystem no folder between the root and the name may be a symlink, wherever
    it points (:mod:`storage.io.local.paths`): :class:`storage.io.local.paths.UnsafeSymlinkError`
    otherwise, and nothing is written. A symlink as the name itself is replaced by the rename.
    """
    path = loc.path(relative)
    if loc.is_local:
        _write_local(loc, relative, data, same_as, sync)
    else:
        if same_as is not None and _copy_in_store(loc, loc.path(same_as), path):
            return
        if isinstance(data, Path):  # fsspec sends it in parts (S3: a multipart upload)
            loc.fs.put_file(str(data), path)
        else:
            loc.fs.pipe_file(path, data)


def _copy_in_store(loc: Location, source: str, path: str) -> bool:
    """Copy ``source`` to ``path`` inside the store; False where the store cannot.

    A refused copy (a filesystem without one, a store without ``CopyObject``, a missing
    source) lets the caller write the bytes instead. A timed-out, throttled or otherwise
    transient one is raised, as a failed PUT would be, for the caller's retry policy: a hung
    server would only hang the PUT as well (the copy's ``HEAD`` alone can use up a read
    timeout).
    """
    try:
        loc.fs.cp_file(source, path)
    except NotImplementedError:  # fsspec's default cp_file
        return False
    except OSError as exc:
        if classify(exc) != PERMANENT:
            raise
        return False
    return True


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """glibc's ``sync_file_range`` (Linux), or ``None`` where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


#: ``SYNC_FILE_RANGE_WRITE``: start writing dirty pages out, do not wait for them
_WRITE_ONLY = 2


def start_writeback(fd: int) -> None:
    """Have the kernel start writing ``fd``'s dirty pages to disk now, without waiting.

    Left alone, Linux writes a file back only after ~30 s or under memory pressure, so the
    ``fsync`` that makes it durable later (phase 2 linking a work file into ``shards/``)
    would write most of a short run's output at once, in the job's serial tail: on 1 GB of
    text with 2 workers, phase 2's tasks took 0.55-0.65 CPU-s with this against 1.00-1.07
    without (Dask task stream, two runs each). Elsewhere (no ``sync_file_range``) a no-op: the later
    ``fsync`` still makes the file durable, only later.
    """
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, 0, 0, _WRITE_ONLY)  # a refusal (EINVAL, ESPIPE) changes nothing: ignored


def _write_local(loc: Location, relative: str, data: Payload, same_as: str | None,
                 sync: bool) -> None:
    """:func:`write_atomic` on a local filesystem, every step relative to the folder's
    descriptor: the folders are opened without following symlinks
    (:func:`storage.io.local.paths.open_folder`), so what is created, renamed and synced is in
    the dataset, not wherever a symlinked folder would have led."""
    *folder, name = local_paths.components(loc.root, loc.path(relative))
    folder_fd = local_paths.open_folder(loc.root, folder, True, relative)
    try:
        if same_as is not None and _link_atomic(loc, same_as, folder_fd, name):
            if sync:  # the source may have been written unsynced (scratch): sync it now
                _fsync_at(folder_fd, name)
                _fsync_fd(folder_fd, folder=True)
            return
        tmp = f".tmp-{os.urandom(8).hex()}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=folder_fd)
        try:
            os.fchmod(fd, 0o666 & ~process_umask())  # what a plain open would give
            with os.fdopen(fd, "wb") as fh:
                if isinstance(data, Path):
                    with open(data, "rb") as source:
                        shutil.copyfileobj(source, fh, 1 << 20)
                else:
                    fh.write(data)
                fh.flush()
                if sync:
                    os.fsync(fh.fileno())
                else:
                    start_writeback(fh.fileno())
            os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=folder_fd)
            raise
        if sync:
            _fsync_fd(folder_fd, folder=True)  # the rename: without it the name may not survive
    finally:
        os.close(folder_fd)


def _fsync_fd(fd: int, folder: bool) -> None:
    """Flush a file's (or a folder's entries') pending writes to disk.

    Some filesystems (several FUSE mounts, some network ones) refuse ``fsync`` on a folder
    with EINVAL or ENOTSUP: they make no promise about names to keep, so there is nothing to
    wait for.
    """
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP) or not folder:
            raise


def _fsync_at(folder_fd: int, name: str) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    try:
        _fsync_fd(fd, folder=False)
    finally:
        os.close(fd)


def _link_atomic(loc: Location, source: str, folder_fd: int, name: str) -> bool:
    """Hard-link ``source`` (relative to ``loc``) to ``name`` in ``folder_fd`` through a
    temporary name; False where not possible, and the caller writes the bytes instead.

    Only a regular file inside the dataset is linked: a source behind a symlinked folder is
    not looked at, and a source that is itself a symlink is not linked (the new name would be
    the link, or with the link followed, the file it points to, maybe outside the dataset).
    """
    try:
        *folder, source_name = local_paths.components(loc.root, loc.path(source))
        source_fd = local_paths.open_folder(loc.root, folder, False, source, "link")
    except (OSError, UnsafePathError):  # missing, or behind a symlink: write the bytes
        return False
    tmp = f".tmp-{os.urandom(8).hex()}.link"
    try:
        os.link(source_name, tmp, src_dir_fd=source_fd, dst_dir_fd=folder_fd,
                follow_symlinks=False)
    except OSError:  # EXDEV, EPERM, ENOTSUP, a missing source: write the bytes instead
        return False
    finally:
        os.close(source_fd)
    try:
        if not stat.S_ISREG(os.stat(tmp, dir_fd=folder_fd, follow_symlinks=False).st_mode):
            os.unlink(tmp, dir_fd=folder_fd)  # linked a symlink (or swapped in for one)
            return False
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder_fd)
        raise
    return True
