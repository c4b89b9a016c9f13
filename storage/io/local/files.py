"""A local location's filesystem without fsspec: :class:`LocalFiles`.

Its reads (``cat_file``: the manifest, the index) are plain OS calls, held to the symlink
rules of :mod:`storage.io.local.paths` on a dataset replica; everything else goes to fsspec's
filesystem (:class:`storage.io.local.dataset_fs.DatasetFileSystem` on a dataset replica), made on
its first use. :func:`storage.io.urls.resolve` gives every local location one.
"""

from __future__ import annotations

import os
from typing import Any

from storage.io.local.paths import check_read


class LocalFiles:
    """The filesystem of a local location: reads itself, everything else through fsspec's.

    ``cat_file`` (a whole file or a byte range: how the manifest and the index are read) is
    answered with ``open``/``seek``/``read``, as fsspec's ``LocalFileSystem`` would; any other
    attribute is that of the fsspec filesystem behind (:attr:`fsspec`), made on first use.
    Why: importing fsspec costs ~20-30 ms of CPU (it reads the entry points of every installed
    package) before a loader's first batch on a local dataset, which reads its manifest and
    index, maps its shards and needs nothing else of it (``tests/loaders/test_imports.py``).

    ``dataset_root``: a dataset replica's root (:meth:`storage.io.urls.Location.confined`):
    every read is held to :func:`check_read` and the fsspec side is a
    :class:`storage.io.local.dataset_fs.DatasetFileSystem`; ``None``: a plain local folder (an input
    corpus), fsspec's ``LocalFileSystem``. ``options``: that filesystem's (``auto_mkdir``...).
    Pickled without the fsspec filesystem; a copy makes its own when it needs one.
    """

    def __init__(self, dataset_root: str | None = None, **options: Any) -> None:
        self.dataset_root = (os.path.normpath(os.path.abspath(dataset_root))
                             if dataset_root is not None else None)
        self.storage_options = options
        self._fs: Any = None

    @property
    def fsspec(self) -> Any:
        """The fsspec filesystem behind (what writes, lists and removes)."""
        if self._fs is None:
            if self.dataset_root is not None:
                from storage.io.local.dataset_fs import DatasetFileSystem

                self._fs = DatasetFileSystem(self.dataset_root, **self.storage_options)
            else:
                from fsspec.implementations.local import LocalFileSystem

                self._fs = LocalFileSystem(**self.storage_options)
        return self._fs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_fs":  # pickling and copying look these up
            raise AttributeError(name)
        return getattr(self.fsspec, name)

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset_root": self.dataset_root, "storage_options": self.storage_options,
                "_fs": None}

    def __repr__(self) -> str:
        return f"LocalFiles(dataset_root={self.dataset_root!r})"

    def local_path(self, path: Any) -> str:
        """``path`` as an absolute local path (no ``file://``), checked against the symlink
        rules when this is a dataset's."""
        p = os.fspath(path)
        for prefix in ("file://", "local://"):
            if p.startswith(prefix):
                p = p[len(prefix):]
        p = os.path.abspath(os.path.expanduser(p))
        if self.dataset_root is not None:
            check_read(self.dataset_root, p)
        return p

    def cat_file(self, path: Any, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (negative: from the end), as fsspec's."""
        if kwargs:
            return self.fsspec.cat_file(path, start=start, end=end, **kwargs)  # type: ignore
        with open(self.local_path(path), "rb") as fh:
            if start is None and end is None:
                return fh.read()
            size = os.fstat(fh.fileno()).st_size
            lo = 0 if start is None else start if start >= 0 else max(0, size + start)
            fh.seek(lo)
            if end is None:
                return fh.read()
            hi = end if end >= 0 else size + end
            return fh.read(hi - lo)  # as fsspec's: -1 reads to the end, below is an error
