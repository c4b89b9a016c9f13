"""The row-group index built on the driver's local disk, a column chunk at a time.

At 100 TB of text the index is ~3.3 GB (~90 M row groups of 36 bytes, plus ~0.3 KB a shard).
Built in memory from the driver's records it peaked at ~124 bytes a row group (11 GB): the
columns, then the object joined from them. Here each column is appended, in chunks, to its own
temporary file and hashed as it grows; the object is then assembled in a named temporary file
(the header, which needs every column's length and SHA-256, first) and hashed on the way, so
the driver holds a chunk, not the index. The store's put reads that file as it sends it
(``storage.io.atomic.Payload``: a multipart upload on S3).

The bytes are :func:`storage.format.index.build_index_arrays`'s (the same head, padding and
column order: :func:`storage.format.index.index_head`): a rerun writes the same object under
the same content-addressed name (``tests/pipeline/output/test_shard_table.py``).

The files live in ``TMPDIR`` (~2x the index at the end, briefly: the columns, then the object),
made by :mod:`tempfile` without a name (``O_TMPFILE``, or unlinked at once), so their space
comes back when they are closed or the process ends, however it ends: a driver killed during
the commit leaves no 3 GB file behind. The store's put opens the object by its descriptor's
name (``/proc/self/fd/N``); where the system has none, it is a named file removed on close.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import IO, Any

import numpy as np

from storage.format.index import GROUP_COLUMNS, column_dtypes, header_bytes, index_head, padding
from storage.format.layout import index_name
from storage.format.manifest import IndexRef

#: bytes copied at a time from a column's file into the object
_COPY = 1 << 20


def _disk_error(exc: OSError) -> OSError:
    return OSError(f"row-group index: cannot write its temporary files under "
                   f"{tempfile.gettempdir()} ({type(exc).__name__}: {exc}); set TMPDIR to a "
                   "local folder with room (~80 bytes a row group at the end of a run)")


class IndexFile:
    """The finished index object in a temporary file: ``path`` (for the store's put),
    ``ref`` (what the manifest records). :meth:`close` gives its space back."""

    def __init__(self, file: IO[bytes], ref: IndexRef) -> None:
        self.file, self.ref = file, ref
        fd_path = Path(f"/proc/self/fd/{file.fileno()}")
        named = isinstance(file.name, str) and os.path.isabs(file.name)
        self.path = Path(file.name) if named or not fd_path.exists() else fd_path

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> IndexFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _object_file() -> IO[bytes]:
    """A file for the object that no crash leaves behind: unnamed where ``/proc/self/fd``
    can name it for the put, else a named one that ``close`` removes."""
    if Path("/proc/self/fd").is_dir():
        return tempfile.TemporaryFile(prefix="shardflow-index-", suffix=".sfidx")
    return tempfile.NamedTemporaryFile(prefix="shardflow-index-", suffix=".sfidx")


class SpilledColumns:
    """The index's columns (:func:`storage.format.index.column_dtypes` of ``names``) appended a
    chunk at a time, each to its own unnamed temporary file, each hashed as it grows."""

    def __init__(self, names: list[str]) -> None:
        self.dtypes = column_dtypes(names)
        self._files: dict[str, IO[bytes]] = {}
        try:
            for name in self.dtypes:
                self._files[name] = tempfile.TemporaryFile(  # noqa: SIM115 (held)
                    prefix=f"shardflow-index-{name}-")
        except OSError as exc:
            self.close()
            raise _disk_error(exc) from None
        self._sha = {name: hashlib.sha256() for name in self.dtypes}
        self._bytes = dict.fromkeys(self.dtypes, 0)

    def extend(self, name: str, values: Any) -> None:
        """Append ``values`` (cast to the column's dtype) to column ``name``."""
        raw = np.ascontiguousarray(np.asarray(values).astype(self.dtypes[name], copy=False))
        view = memoryview(raw.reshape(-1).view(np.uint8))
        try:
            self._files[name].write(view)
        except OSError as exc:
            raise _disk_error(exc) from None
        self._sha[name].update(view)
        self._bytes[name] += view.nbytes

    def finish(self, n_groups: int, n_shards: int, digest: str) -> IndexFile:
        """The object in a named temporary file, and its reference (``digest``: the
        algorithm of its row-group digests); the column files are closed."""
        for name, dtype in self.dtypes.items():  # what a reader will check: say it here
            rows = self._bytes[name] // np.dtype(dtype).itemsize
            want = {"first_group": n_shards + 1, "path_end": n_shards + 1, "paths": rows
                    }.get(name, n_groups if name in GROUP_COLUMNS else n_shards)
            if rows != want:
                raise ValueError(f"index column {name!r}: {rows} values written, {want} due")
        head = index_head({n: (self._bytes[n], self._sha[n].hexdigest()) for n in self.dtypes},
                          n_groups, n_shards)
        whole = hashlib.sha256(head)
        try:
            out = _object_file()
        except OSError as exc:
            self.close()
            raise _disk_error(exc) from None
        try:
            buffer = bytearray(_COPY)
            view = memoryview(buffer)
            out.write(head)
            size = len(head)
            for column in sorted(self.dtypes):
                source = self._files[column]
                source.seek(0)
                while got := source.readinto(view):
                    out.write(view[:got])
                    whole.update(view[:got])
                pad = padding(self._bytes[column])
                out.write(pad)
                whole.update(pad)
                size += self._bytes[column] + len(pad)
                source.close()  # its space back before the next is copied
            out.flush()
        except OSError as exc:
            out.close()
            raise _disk_error(exc) from None
        except BaseException:
            out.close()
            raise
        finally:
            self.close()
        sha = whole.hexdigest()
        ref = IndexRef(index_name(sha), size, sha,
                       hashlib.sha256(header_bytes(head)).hexdigest(), digest)
        return IndexFile(out, ref)

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()

