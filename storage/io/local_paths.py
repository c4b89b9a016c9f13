"""A local dataset is read, written and cleaned up inside its root, never through a symlink out.

Why: a dataset directory may come from someone else (a copy, an unpacked archive, a folder on
a shared filesystem), and its manifest and index name the paths that ``repair``, ``gc``, the
pipeline and the loader then touch. ``storage.format.layout.safe_relative`` keeps those names
free of ``..`` and absolute paths, but a folder of the dataset that is a *symlink* would still
carry a write (``repair`` restoring a shard into ``shards/``) or a removal to wherever it points.

The rules, for local filesystems (a ``file://`` URL or a plain path; object stores have no
symlinks, and nothing here runs for them):

- **Writes** (:func:`storage.io.atomic.write_atomic`) and **removals** never go through a
  symlinked folder, wherever it points, also inside the root: ``shards -> index`` would make a
  write named ``shards/x`` land at ``index/x``, where a content-addressed name means other
  bytes. Each folder is opened from its parent's descriptor with ``O_NOFOLLOW``
  (:func:`open_folder`) and the file is created, renamed or unlinked relative to the last one,
  so a folder swapped for a symlink while this runs is refused too. The *name* itself may be a
  symlink: a rename replaces the link and an unlink removes it; neither follows it.
- **Reads** follow a symlink (a folder or the file) only when where it leads stays inside the
  real root (``os.path.realpath`` of the root, cached per process): a dataset may spread its
  folders over disks mounted inside it, not borrow files from elsewhere. Checked once per
  object opened (an ``lstat`` per component below the root: two for a shard), not per row
  group. A read is also checked against the manifest's digests, so a link swapped in between
  the check and the open can at worst fail a read, never feed other bytes.
- The root itself, and the folders above it, may be symlinks: the user named that path.

Breaking a rule raises :class:`UnsafeSymlinkError` (an :class:`UnsafePathError`, so callers
that refuse unsafe manifest paths refuse these as well), naming the link, where it leads and
the object that was to be read or written.

:class:`DatasetFileSystem` applies the rules to every fsspec call on a dataset's local replica
(``ReplicaSet`` gives each local replica one): the reads of the manifest, index and shards,
``gc``'s and ``repair``'s listings and removals. The loader's memory-mapped shards check
:func:`check_read` when a shard is mapped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from storage.format.layout import UnsafePathError

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


class UnsafeSymlinkError(UnsafePathError):
    """A local dataset path goes through a symlink that Shardflow does not follow.

    ``link`` is the symlink's path relative to the dataset root, ``target`` where it resolves
    to, ``relative`` the object that was to be read, written or removed.
    """

    def __init__(self, root: str, relative: str, link: str, target: str, action: str,
                 outside: bool) -> None:
        where = ("outside the dataset" if outside
                 else "inside the dataset, but a write never goes through a symlink")
        super().__init__(
            f"{link} is a symlink to {target} ({where}): refusing to {action} {relative} "
            f"through it (dataset {root}); replace the link with the real "
            f"{'folder' if os.path.isdir(target) else 'file'}")
        self.root, self.relative, self.link, self.target = root, relative, link, target
        self._args = (root, relative, link, target, action, outside)

    def __reduce__(self) -> tuple[type[UnsafeSymlinkError], tuple[str, str, str, str, str, bool]]:
        """Rebuilt from its parts where it crosses processes (a Dask task's error, a
        DataLoader worker's): the default would call the class with the message alone."""
        return type(self), self._args


_REAL_ROOTS: dict[str, str] = {}


def real_root(root: str) -> str:
    """``os.path.realpath(root)``, cached once the root exists (a root made later, by the
    first write of a pipeline, is resolved again until then)."""
    real = _REAL_ROOTS.get(root)
    if real is None:
        real = os.path.realpath(root)
        if os.path.isdir(real):
            _REAL_ROOTS[root] = real
    return real


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def components(root: str, path: str) -> list[str]:
    """The components of ``path`` below ``root`` (``[]`` for the root itself).

    Refuses a path that is not under the root, or that climbs with ``..``: a dataset's
    filesystem is asked only about the dataset.
    """
    base = root.rstrip("/")
    if path.rstrip("/") == base:
        return []
    if not path.startswith(base + "/"):
        raise UnsafePathError(f"{path} is not inside the dataset {root}")
    parts = [p for p in path[len(base) + 1:].split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePathError(f"{path} climbs out of the dataset {root} with '..'")
    return parts


def _refuse(root: str, parts: list[str], upto: int, action: str, outside: bool) -> None:
    link = "/".join(parts[:upto + 1])
    target = os.path.realpath(os.path.join(root, link))
    raise UnsafeSymlinkError(root, "/".join(parts), link, target, action, outside)


def check_read(root: str, path: str, action: str = "read") -> None:
    """Refuse ``path`` (absolute, under ``root``) when a symlink on the way leads out of the
    real root; a missing component is left to the open that follows to report."""
    parts = components(root, path)
    current = root.rstrip("/")
    for i, part in enumerate(parts):
        current = f"{current}/{part}"
        try:
            mode = os.lstat(current).st_mode
        except OSError:
            return
        if stat.S_ISLNK(mode) and not _inside(os.path.realpath(current), real_root(root)):
            _refuse(root, parts, i, action, outside=True)


def check_write(root: str, path: str, action: str = "write", name_too: bool = False) -> None:
    """Refuse ``path`` when a folder on the way (and, with ``name_too``, the name itself: an
    ``open`` for writing follows it) is a symlink. For calls that take a path (fsspec's);
    :func:`open_folder` is the race-free form."""
    parts = components(root, path)
    current = root.rstrip("/")
    last = len(parts) if name_too else len(parts) - 1
    for i, part in enumerate(parts[:last]):
        current = f"{current}/{part}"
        try:
            mode = os.lstat(current).st_mode
        except OSError:
            return
        if stat.S_ISLNK(mode):
            outside = not _inside(os.path.realpath(current), real_root(root))
            _refuse(root, parts, i, action, outside)


def open_folder(root: str, folder: list[str], create: bool, relative: str,
                action: str = "write") -> int:
    """A descriptor of ``root/<folder...>``, each folder opened from its parent's descriptor
    without following a symlink (made, when ``create``, as ``os.makedirs`` would).

    ``relative`` (the object the folder is opened for) and ``action`` only word the error. The
    caller closes the descriptor.
    """
    if create:
        os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(folder):
            if part in ("", ".", ".."):
                raise UnsafePathError(f"{relative}: not a plain path inside the dataset {root}")
            try:
                inner = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made meanwhile: opened below
                    os.mkdir(part, 0o777, dir_fd=fd)
                inner = _open_existing(fd, root, folder, i, relative, action)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                inner = _open_existing(fd, root, folder, i, relative, action)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_existing(fd: int, root: str, folder: list[str], i: int, relative: str,
                   action: str) -> int:
    """Open ``folder[i]`` under ``fd`` again, naming the symlink when that is what is there."""
    try:
        return os.open(folder[i], _FOLDER_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        if not stat.S_ISLNK(os.stat(folder[i], dir_fd=fd, follow_symlinks=False).st_mode):
            raise  # a file where a folder should be: the plain error says so
        link = "/".join(folder[:i + 1])
        target = os.path.realpath(os.path.join(root, link))
        raise UnsafeSymlinkError(root, relative, link, target, action,
                                 not _inside(target, real_root(root))) from None


class DatasetFileSystem(LocalFileSystem):
    """The local filesystem of one dataset replica, held to the rules of this module.

    Every path it is given must lie under ``dataset_root``. Reads (``open`` for reading,
    ``cat_file``, ``info``, ``ls``/``find``) refuse a symlink out of the root; writes and
    removals refuse any symlinked folder, and ``rm`` works relative to the folder's
    descriptor, so it removes a symlinked name itself and never what it points to.
    """

    def __init__(self, dataset_root: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dataset_root = os.path.normpath(os.path.abspath(dataset_root))

    def _read(self, path: Any) -> str:
        p = self._strip_protocol(path)
        check_read(self.dataset_root, p)
        return p

    def _write(self, path: Any, action: str = "write", name_too: bool = True) -> str:
        p = self._strip_protocol(path)
        check_write(self.dataset_root, p, action, name_too)
        return p

    # -- reads ---------------------------------------------------------------------------

    def _open(self, path: Any, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        writes = any(c in mode for c in "wax+")
        p = self._write(path) if writes else self._read(path)
        return super()._open(p, mode, block_size, **kwargs)

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        if not isinstance(path, os.DirEntry):  # an entry of a folder ls() has checked
            path = self._read(path)
        return super().info(path, **kwargs)

    def ls(self, path: Any, detail: bool = False, **kwargs: Any) -> Any:
        return super().ls(self._read(path), detail=detail, **kwargs)

    def isfile(self, path: Any) -> bool:
        return super().isfile(self._read(path))

    def isdir(self, path: Any) -> bool:
        return super().isdir(self._read(path))

    def get_file(self, path1: Any, path2: Any, callback: Any = None, **kwargs: Any) -> Any:
        return super().get_file(self._read(path1), path2, callback, **kwargs)

    # -- writes --------------------------------------------------------------------------

    def cp_file(self, path1: Any, path2: Any, **kwargs: Any) -> Any:
        return super().cp_file(self._read(path1), self._write(path2), **kwargs)

    def put_file(self, path1: Any, path2: Any, callback: Any = None, **kwargs: Any) -> Any:
        """``path1`` is the caller's own local file, not the dataset's."""
        return LocalFileSystem.cp_file(self, path1, self._write(path2), **kwargs)

    def mv(self, path1: Any, path2: Any, recursive: bool = True, **kwargs: Any) -> Any:
        return super().mv(self._write(path1, "move", name_too=False), self._write(path2),
                          recursive=recursive, **kwargs)

    def link(self, src: Any, dst: Any, **kwargs: Any) -> Any:
        return super().link(self._read(src), self._write(dst), **kwargs)

    def symlink(self, src: Any, dst: Any, **kwargs: Any) -> Any:
        return super().symlink(src, self._write(dst), **kwargs)

    def touch(self, path: Any, truncate: bool = True, **kwargs: Any) -> Any:
        return super().touch(self._write(path), truncate=truncate, **kwargs)

    def chmod(self, path: Any, mode: int) -> Any:
        return super().chmod(self._write(path, "change"), mode)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        p = self._strip_protocol(path)
        if not exist_ok and os.path.lexists(p):
            raise FileExistsError(p)
        os.close(open_folder(self.dataset_root, components(self.dataset_root, p), True, p,
                             "make"))

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        p = self._strip_protocol(path)
        if os.path.lexists(p):
            raise FileExistsError(p)
        if create_parents:
            self.makedirs(p, exist_ok=True)
            return
        fd, name = self._folder_of(p, "make")
        try:
            os.mkdir(name, dir_fd=fd, **kwargs)
        finally:
            os.close(fd)

    # -- removals ------------------------------------------------------------------------

    def _folder_of(self, path: str, action: str) -> tuple[int, str]:
        """The descriptor of ``path``'s folder (opened without following symlinks) and the
        name in it."""
        parts = components(self.dataset_root, path)
        if not parts:
            raise UnsafePathError(f"refusing to {action} the dataset root {path} itself")
        fd = open_folder(self.dataset_root, parts[:-1], False, "/".join(parts), action)
        return fd, parts[-1]

    def rm_file(self, path: Any) -> None:
        fd, name = self._folder_of(self._strip_protocol(path), "remove")
        try:
            os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    def rmdir(self, path: Any) -> None:
        fd, name = self._folder_of(self._strip_protocol(path), "remove")
        try:
            os.rmdir(name, dir_fd=fd)
        finally:
            os.close(fd)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        for p in path if isinstance(path, list) else [path]:
            p = self._strip_protocol(p)
            if not components(self.dataset_root, p):  # the whole dataset: as fsspec does
                super().rm(p, recursive=recursive, maxdepth=maxdepth)
                continue
            fd, name = self._folder_of(p, "remove")
            try:
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    if not recursive:
                        raise ValueError("Cannot delete directory, set recursive=True")
                    shutil.rmtree(name, dir_fd=fd)  # descriptor-based: follows no symlink
                else:
                    os.unlink(name, dir_fd=fd)  # a symlink: the link itself
            finally:
                os.close(fd)
