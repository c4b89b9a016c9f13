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

Who applies them: a local location's filesystem is a
:class:`storage.io.local.files.LocalFiles`, which reads (``cat_file``: the manifest, the index)
with plain OS calls and hands everything else to fsspec's filesystem, made on its first use. A
dataset replica's (``ReplicaSet`` confines each local replica) checks :func:`check_read` on
every read, and its fsspec side is :class:`storage.io.local.dataset_fs.DatasetFileSystem`, which
applies the rules to every other call (``gc``'s and ``repair``'s listings and removals, the
pipeline's writes). The loader's memory-mapped shards check :func:`check_read` when a shard is
mapped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

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

