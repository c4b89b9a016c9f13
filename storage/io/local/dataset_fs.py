"""The fsspec side of a local dataset replica: :class:`DatasetFileSystem`, fsspec's
``LocalFileSystem`` held to the symlink rules of :mod:`storage.io.local.paths` on every call.

Apart from those rules so that they (and :class:`storage.io.local.files.LocalFiles`, the
replica's reads) import no fsspec: this module is loaded only when a call needs more than a
read (a write, a listing, a removal), not by a loader reading a local dataset.
"""

from __future__ import annotations

import os
import shutil
import stat
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from storage.format.layout import UnsafePathError
from storage.io.local.paths import check_read, check_write, components, open_folder


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
