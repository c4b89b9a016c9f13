"""The input files as a compact table: a few dozen bytes a file, filled a listing page at a time.

Ten million input files as Python objects (an fsspec info dict, then an ``InputFile`` each)
cost the driver ~2 KB a file: 20 GB. Here a file is what the plan needs, in NumPy arrays:

- its URL: a prefix shared with its listing page (kept once per page) + its own suffix in one
  byte blob (``f000123.txt``: ~7 bytes and a 4-byte offset);
- its version (size + ETag/mtime, for the resume keys): the same prefix + suffix scheme (a
  page of files with one mtime costs nothing a file);
- its size (8 bytes), format and compression codes (1 byte each).

Rows are sorted by URL and unique. Listings that come sorted (an S3 prefix's pages; fsspec's
``glob``) are appended as they come; anything else (several inputs, an unsorted
``--inputs-from`` file) is sorted once at the end (as Python strings, in memory: see
:func:`_sorted_unique`). Parquet files also get their row groups' byte sizes (one footer read
each), kept per Parquet file only.

Past :data:`SPILL_ROWS` rows the columns leave memory: each goes to a temporary file (one per
column, made by :func:`tempfile.TemporaryFile` in ``TMPDIR``, unlinked at once, so its space
is freed when the table is closed or collected, or the process ends however it ends), pages
appended as they are listed. A column is then read back :data:`CHUNK_ROWS` rows at a time
with ``pread`` into one cached chunk per column (:class:`DiskColumn`): the driver holds
O(chunk + listing pages), not O(files) (~21 bytes a file: 201 MB at 10 M files). Not a memory
map: the pages of a mapping that were touched count as the driver's resident memory until the
kernel needs them back, and a pass over the table touches all of them. Smaller tables stay in
NumPy arrays, as before.
"""

from __future__ import annotations

import array
import bisect
import operator
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, overload

import numpy as np

#: format and compression codes (the index in these tuples)
FORMAT_CODES = ("jsonl", "txt", "csv", "parquet", "warc")
COMPRESSION_CODES = (None, "gzip", "zstd", "bz2", "xz")
#: a version suffix that starts with this holds the whole version string (not ``size:tag``)
_LITERAL = "\x00"
#: a table of more rows than this keeps its columns in temporary files (module docstring)
SPILL_ROWS = 64 * 1024
#: rows of a spilled column read back together (one such chunk cached per column)
CHUNK_ROWS = 16 * 1024


@dataclass(frozen=True)
class InputFile:
    """One input file: a row of :class:`FileTable` as an object (what plans and readers take)."""

    url: str
    fmt: str
    compression: str | None
    size: int
    #: Parquet only: compressed byte size of each row group (empty when unreadable)
    row_groups: tuple[int, ...] = ()
    #: what identifies this version of the file (size + mtime/ETag) for resumption keys
    version: str = ""


class Growable:
    """A 1-D NumPy array appended to a page at a time, grown in place (``ndarray.resize``,
    a ``realloc``: a large block is moved by remapping, not copied).

    Why not a list of per-page arrays joined at the end: ten thousand 8-KB arrays come from
    the heap among Python's objects, and once joined and freed the heap keeps their pages
    (fragmented, never handed back): +330 MB of driver RSS at 10 M files, on top of the
    table's own 200 MB.
    """

    def __init__(self, dtype: Any, capacity: int = 4096) -> None:
        self._a = np.zeros(max(1, capacity), dtype=dtype)
        self.n = 0

    def extend(self, values: Any) -> None:
        values = np.asarray(values)
        end = self.n + len(values)
        if end > len(self._a):
            # by 1/8, as bytearray grows: the room beyond the end is zero-filled (resident)
            self._a.resize(max(end, len(self._a) + len(self._a) // 8), refcheck=False)
        self._a[self.n:end] = values
        self.n = end

    def astype(self, dtype: Any) -> None:
        self._a = self._a[:self.n].astype(dtype)

    @property
    def dtype(self) -> np.dtype:
        return self._a.dtype

    def finish(self) -> np.ndarray:
        """The array, trimmed to its length (in place); the builder is spent."""
        self._a.resize(self.n, refcheck=False)
        out, self._a = self._a, np.zeros(1, self._a.dtype)
        return out


def _spill_error(exc: OSError) -> OSError:
    return OSError(f"file table: cannot write its temporary file under "
                   f"{tempfile.gettempdir()} ({type(exc).__name__}: {exc}); set TMPDIR to a "
                   "local folder with room (~25 bytes an input file)")


def _write(fh: IO[bytes], data: Any) -> None:
    try:
        fh.write(memoryview(data).cast("B"))
    except OSError as exc:
        raise _spill_error(exc) from None


def pread_exact(fd: int, nbytes: int, offset: int, what: str = "file table") -> bytearray:
    """``nbytes`` at ``offset`` of ``fd`` into a new buffer (``pread``: no shared position,
    so threads may read one file at once); ``what`` names the file's owner in the error."""
    buf = bytearray(nbytes)
    view = memoryview(buf)
    got = 0
    while got < nbytes:
        if hasattr(os, "preadv"):
            k = os.preadv(fd, [view[got:]], offset + got)
        else:  # pragma: no cover - platforms without preadv
            part = os.pread(fd, nbytes - got, offset + got)
            view[got:got + len(part)] = part
            k = len(part)
        if k <= 0:
            raise OSError(f"{what}: its temporary file ends at byte {offset + got}, "
                          f"{nbytes - got} bytes short of what was written")
        got += k
    return buf


class Spill:
    """The temporary files of one table's spilled columns (see the module docstring): made by
    :func:`tempfile.TemporaryFile` in ``TMPDIR``, without a name from the start, so nothing is
    left behind whatever ends the process; :meth:`close` frees their space at once."""

    def __init__(self) -> None:
        self.files: list[IO[bytes]] = []
        self.folder = tempfile.gettempdir()

    def new_file(self) -> IO[bytes]:
        try:
            fh = tempfile.TemporaryFile(prefix="shardflow-filetable-")  # noqa: SIM115 (held)
        except OSError as exc:
            raise _spill_error(exc) from None
        self.files.append(fh)
        return fh

    def flush(self) -> None:
        for fh in self.files:
            try:
                fh.flush()
            except OSError as exc:
                raise _spill_error(exc) from None

    def nbytes(self) -> int:
        """The files' size on disk (0 once closed)."""
        return sum(os.fstat(fh.fileno()).st_size for fh in self.files if not fh.closed)

    @property
    def closed(self) -> bool:
        return all(fh.closed for fh in self.files)

    def close(self) -> None:
        for fh in self.files:
            fh.close()


class ColumnFile:
    """A column being written to a spill file, a page at a time (a :class:`Growable`'s
    ``extend``; :meth:`finish` gives the :class:`DiskColumn` that reads it back)."""

    def __init__(self, spill: Spill, dtype: Any) -> None:
        self.fh = spill.new_file()
        self.dtype = np.dtype(dtype)
        self.n = 0

    def extend(self, values: Any) -> None:
        a = np.ascontiguousarray(values, dtype=self.dtype)
        _write(self.fh, a)
        self.n += len(a)

    def finish(self, chunk_rows: int = CHUNK_ROWS) -> DiskColumn:
        try:
            self.fh.flush()
        except OSError as exc:
            raise _spill_error(exc) from None
        return DiskColumn(self.fh, self.dtype, self.n, chunk_rows)


class DiskColumn:
    """A 1-D array in a spill file, read back with ``pread``: ``col[i]`` (a Python int, from
    the one cached chunk of ``chunk_rows`` rows around ``i``), ``col[lo:hi]`` (a new
    ndarray, read at once, not cached), ``len(col)``. Whole-column expressions
    (``col == x``, ``col.sum()``) are not offered: scan it with ``col[lo:hi]`` a chunk at a
    time (:meth:`FileTable.any_format` does)."""

    def __init__(self, fh: IO[bytes], dtype: Any, n: int, chunk_rows: int = CHUNK_ROWS) -> None:
        self._fh = fh  # kept: the file lives as long as a column reads it
        self._fd = fh.fileno()
        self.dtype = np.dtype(dtype)
        self.n = n
        self.chunk_rows = max(1, chunk_rows)
        #: (first row, end row, the chunk's values: an ``array.array``, 8 bytes a row at
        #: most, whose items are Python ints): replaced whole, so threads may share it
        self._cached: tuple[int, int, Sequence[int]] = (0, 0, [])

    def __len__(self) -> int:
        return self.n

    @property
    def nbytes(self) -> int:
        """What the column holds (on disk)."""
        return self.n * self.dtype.itemsize

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)`` (clipped to the column) as a new array."""
        lo, hi = max(0, lo), min(self.n, hi)
        if hi <= lo:
            return np.zeros(0, self.dtype)
        size = self.dtype.itemsize
        return np.frombuffer(pread_exact(self._fd, (hi - lo) * size, lo * size), self.dtype)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> np.ndarray: ...
    def __getitem__(self, i: Any) -> Any:
        if type(i) is not int:
            if isinstance(i, slice):
                lo, hi, step = i.indices(self.n)
                if step == 1:
                    return self.read(lo, hi)
                rows = range(lo, hi, step)
                if not rows:
                    return np.zeros(0, self.dtype)
                first = min(rows[0], rows[-1])
                return self.read(first, max(rows[0], rows[-1]) + 1)[
                    np.arange(lo, hi, step) - first]
            i = operator.index(i)
        first, end, values = self._cached
        if first <= i < end:
            return values[i - first]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"row {i} of a column of {self.n}")
        first = i - i % self.chunk_rows
        values = _compact(self.read(first, first + self.chunk_rows))
        self._cached = (first, first + len(values), values)
        return values[i - first]


def _compact(values: np.ndarray) -> Sequence[int]:
    """``values`` as an ``array.array`` (its items come out as Python ints, as fast as a
    list's, without a Python int object held per row)."""
    code = {"i1": "b", "u1": "B", "i4": "i", "u4": "I", "i8": "q", "u8": "Q"}.get(
        values.dtype.str[1:])
    if code is None or array.array(code).itemsize != values.dtype.itemsize:
        return values.tolist()  # pragma: no cover - not a dtype of ours
    return array.array(code, np.ascontiguousarray(values, values.dtype.newbyteorder("=")))


def chunks(column: Any, rows: int = CHUNK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, rows [first, first + rows))`` of a column, in memory or on disk."""
    n = len(column)
    for lo in range(0, n, rows):
        yield lo, column[lo:min(n, lo + rows)]


class PrefixedStrings:
    """Strings stored as runs of a shared prefix + one blob of UTF-8 suffixes (in memory, or
    after :meth:`spill` in two spill files: the blob and the suffixes' int64 end offsets)."""

    def __init__(self) -> None:
        self._run_starts: list[int] = []
        self._prefixes: list[str] = []
        self.n = 0
        # one growing buffer each, never a list of per-page pieces (see Growable)
        self._blob: bytearray = bytearray()
        self._blob_len = 0
        self._ends: Growable | ColumnFile = Growable(np.uint32)  # 0, then each suffix's end
        self._ends.extend([0])
        self._offsets: np.ndarray | DiskColumn | None = None
        self._blob_file: IO[bytes] | None = None
        self._chunk_rows = CHUNK_ROWS
        #: spilled: (first row, end row, its chunk's suffix ends from 0, the chunk's
        #: suffixes as str when ASCII else bytes); replaced whole, so threads may share it
        self._cached: tuple[int, int, Sequence[int], str | bytes] = (0, 0, [], "")

    def spill(self, spill: Spill) -> None:
        """From now on the suffixes and their offsets go to spill files (what is held so far
        is written there first and freed)."""
        if self._blob_file is not None:
            return
        assert isinstance(self._ends, Growable)
        ends = self._ends.finish()
        self._ends = ColumnFile(spill, np.int64)
        self._ends.extend(ends)
        self._blob_file = spill.new_file()
        _write(self._blob_file, self._blob)
        self._blob = bytearray()

    def append_page(self, items: list[str]) -> None:
        if not items:
            return
        prefix = os.path.commonprefix(items)
        cut = len(prefix)
        suffixes = [s[cut:] for s in items]
        joined = "".join(suffixes)
        blob = joined.encode("utf-8")
        if len(blob) == len(joined):  # ASCII: a character is a byte
            lengths = np.fromiter(map(len, suffixes), dtype=np.int64, count=len(suffixes))
        else:
            lengths = np.fromiter((len(s.encode("utf-8")) for s in suffixes), dtype=np.int64,
                                  count=len(suffixes))
        if not self._prefixes or self._prefixes[-1] != prefix:
            self._run_starts.append(self.n)
            self._prefixes.append(prefix)
        ends = np.cumsum(lengths)
        ends += self._blob_len
        if self._blob_file is None:
            if self._blob_len + len(blob) >= 2**32 and self._ends.dtype != np.int64:
                assert isinstance(self._ends, Growable)
                self._ends.astype(np.int64)  # past 4 GiB of suffixes
            self._blob += blob
        else:
            _write(self._blob_file, blob)
        self._blob_len += len(blob)
        self._ends.extend(ends)
        self.n += len(items)

    def finish(self, chunk_rows: int = CHUNK_ROWS) -> PrefixedStrings:
        self._chunk_rows = max(1, chunk_rows)
        offsets = (self._ends.finish() if isinstance(self._ends, Growable)
                   else self._ends.finish(self._chunk_rows))
        self._offsets = offsets if self._blob_len else None  # None: every suffix empty
        return self

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> str:
        run = bisect.bisect_right(self._run_starts, i) - 1
        if self._offsets is None:
            return self._prefixes[run]
        if self._blob_file is None:
            lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
            return self._prefixes[run] + self._blob[lo:hi].decode("utf-8")
        first, end, ends, text = self._cached
        if not first <= i < end:
            if not 0 <= i < self.n:
                raise IndexError(i)
            first, end, ends, text = self._cached = self._read_chunk(i - i % self._chunk_rows)
        j = i - first
        piece = text[ends[j]:ends[j + 1]]
        return self._prefixes[run] + (piece if isinstance(piece, str) else piece.decode())

    def _read_chunk(self, first: int) -> tuple[int, int, Sequence[int], str | bytes]:
        assert isinstance(self._offsets, DiskColumn) and self._blob_file is not None
        end = min(self.n, first + self._chunk_rows)
        ends = self._offsets.read(first, end + 1)
        base = int(ends[0])
        blob = bytes(pread_exact(self._blob_file.fileno(), int(ends[-1]) - base, base))
        text = blob.decode("utf-8")
        return first, end, _compact(ends - base), text if len(text) == len(blob) else blob

    def nbytes(self) -> int:
        """What the strings hold (on disk for a spilled column; the prefixes in memory)."""
        return self._blob_len + (0 if self._offsets is None else self._offsets.nbytes) + \
            sum(len(p) + 16 for p in self._prefixes)


def _version_of(stored: str, size: int) -> str:
    """A version from its stored suffix (see :func:`_version_suffixes`) and the file's size."""
    return stored[1:] if stored.startswith(_LITERAL) else f"{size}:{stored}"


@dataclass
class FileTable(Sequence[Any]):
    """The sorted, unique input files (see the module docstring). ``table[i]`` is an
    :class:`pipeline.planning.discovery.InputFile`, made on demand.

    The columns ``sizes``, ``formats`` and ``compressions`` are ndarrays, or past
    :data:`SPILL_ROWS` rows :class:`DiskColumn`: both take ``[i]``, ``[lo:hi]`` (an
    ndarray) and ``len``; scans go through :meth:`any_format`, :meth:`indices_of_format`,
    :attr:`total_bytes`, :meth:`empty_urls` (a chunk at a time).
    """

    urls: PrefixedStrings
    versions: PrefixedStrings
    sizes: Any  # np.ndarray | DiskColumn
    formats: Any
    compressions: Any
    #: Parquet files only: file index -> compressed byte size of each row group
    row_groups: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: the temporary files of a spilled table (None: in memory)
    spill: Spill | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.sizes)

    def url(self, i: int) -> str:
        return self.urls[i]

    def version(self, i: int) -> str:
        return _version_of(self.versions[i], int(self.sizes[i]))

    def fmt(self, i: int) -> str:
        return FORMAT_CODES[self.formats[i]]

    def compression(self, i: int) -> str | None:
        return COMPRESSION_CODES[self.compressions[i]]

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return InputFile(self.url(i), self.fmt(i), self.compression(i), int(self.sizes[i]),
                         self.row_groups.get(i, ()), self.version(i))

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def url_list(self) -> UrlView:
        return UrlView(self)

    @property
    def total_bytes(self) -> int:
        return sum(int(part.sum(dtype=np.int64)) for _, part in chunks(self.sizes))

    def any_format(self, code: int) -> bool:
        """Whether any file has format ``code`` (an index of :data:`FORMAT_CODES`)."""
        return any(bool((part == code).any()) for _, part in chunks(self.formats))

    def indices_of_format(self, code: int) -> np.ndarray:
        """The indices of the files of format ``code``, ascending (int64)."""
        found = [np.flatnonzero(part == code) + lo for lo, part in chunks(self.formats)]
        return np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)

    def empty_urls(self, limit: int | None = None) -> tuple[int, list[str]]:
        """How many files have 0 bytes, and the URLs of the first ``limit`` of them."""
        count, urls = 0, []
        for lo, part in chunks(self.sizes):
            zero = np.flatnonzero(part == 0)
            count += len(zero)
            take = len(zero) if limit is None else max(0, min(len(zero), limit - len(urls)))
            urls += [self.url(lo + int(i)) for i in zero[:take]]
        return count, urls

    def nbytes(self) -> int:
        """What the table holds, in memory or spilled (the arrays and blobs; Parquet row
        groups not counted)."""
        return (self.urls.nbytes() + self.versions.nbytes() + self.sizes.nbytes
                + self.formats.nbytes + self.compressions.nbytes)

    @property
    def spilled(self) -> bool:
        return self.spill is not None

    def spill_bytes(self) -> int:
        """The size of the table's temporary files (0: in memory, or closed)."""
        return 0 if self.spill is None else self.spill.nbytes()

    def spill_note(self) -> str:
        """One line on where a spilled table's columns are (for the job's log)."""
        if self.spill is None:
            return f"file table: {self.nbytes() / 2**20:.1f} MB in memory"
        return (f"file table: {self.spill_bytes() / 2**20:.1f} MB in temporary files under "
                f"{self.spill.folder} (read back {self.sizes.chunk_rows:,} rows at a time)")

    def close(self) -> None:
        """Frees the temporary files of a spilled table (reading it afterwards fails); an
        in-memory table is unchanged. Collecting the table does the same."""
        if self.spill is not None:
            self.spill.close()

    def __enter__(self) -> FileTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UrlView(Sequence[str]):
    """The table's URLs as a read-only sequence (decoded one at a time)."""

    def __init__(self, table: FileTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.table.url(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.table.url(i)


@dataclass
class Entry:
    """One listed file before it enters the table (only pages of these are ever held)."""

    url: str
    size: int
    version: str
    fmt: int
    compression: int


class TableBuilder:
    """Fills a :class:`FileTable` a page at a time.

    ``add_page(urls, sizes, versions, codes)``: parallel lists for one listing page. While
    every URL is greater than the one before, rows are appended as they come; the first that
    is not (a second input, an unsorted list) makes :meth:`finish` sort and de-duplicate once
    (the first occurrence of a URL is kept, as the inputs' order gives it).

    Once a page would take the table past ``spill_rows`` rows (:data:`SPILL_ROWS`), what is
    held so far goes to the spill files and every later page is appended there as it comes;
    the finished table reads ``chunk_rows`` rows (:data:`CHUNK_ROWS`) back at a time.
    """

    def __init__(self, spill_rows: int | None = None, chunk_rows: int | None = None) -> None:
        self.spill_rows = SPILL_ROWS if spill_rows is None else spill_rows
        self.chunk_rows = max(1, CHUNK_ROWS if chunk_rows is None else chunk_rows)
        self.spill: Spill | None = None
        self.urls = PrefixedStrings()
        self.versions = PrefixedStrings()
        self._sizes: Growable | ColumnFile = Growable(np.int64)
        self._formats: Growable | ColumnFile = Growable(np.uint8)
        self._compressions: Growable | ColumnFile = Growable(np.uint8)
        self.sorted = True
        self._last: str | None = None
        self.n = 0

    def _start_spill(self) -> None:
        spill = self.spill = Spill()
        try:
            for name in ("_sizes", "_formats", "_compressions"):
                held = getattr(self, name)
                column = ColumnFile(spill, held.dtype)
                column.extend(held.finish())
                setattr(self, name, column)
            self.urls.spill(spill)
            self.versions.spill(spill)
        except BaseException:
            spill.close()
            raise

    def add_page(self, urls: list[str], sizes: list[int], versions: list[str] | None,
                 formats: list[int], compressions: list[int],
                 tags: list[str] | None = None) -> None:
        """``tags`` instead of ``versions``: each version is ``f"{size}:{tag}"``."""
        if not urls:
            return
        if self.spill is None and self.n + len(urls) > self.spill_rows:
            self._start_spill()
        if self.sorted and ((self._last is not None and not self._last < urls[0])
                            or not all(map(operator.lt, urls, urls[1:]))):
            self.sorted = False
        self._last = urls[-1]
        self.urls.append_page(urls)
        if tags is not None and not any(t.startswith(_LITERAL) for t in tags):
            self.versions.append_page(tags)
        else:
            self.versions.append_page(_version_suffixes(
                sizes, versions if versions is not None else
                [f"{s}:{t}" for s, t in zip(sizes, tags or [], strict=True)]))
        self._sizes.extend(np.asarray(sizes, dtype=np.int64))
        self._formats.extend(np.asarray(formats, dtype=np.uint8))
        self._compressions.extend(np.asarray(compressions, dtype=np.uint8))
        self.n += len(urls)

    def _column(self, column: Growable | ColumnFile) -> Any:
        return column.finish() if isinstance(column, Growable) else \
            column.finish(self.chunk_rows)

    def finish(self) -> FileTable:
        if self.spill is not None:
            self.spill.flush()
        table = FileTable(self.urls.finish(self.chunk_rows),
                          self.versions.finish(self.chunk_rows), self._column(self._sizes),
                          self._column(self._formats), self._column(self._compressions),
                          spill=self.spill)
        if self.sorted:
            return table
        with table:  # its spill files, if any, go once the sorted copy is made
            return _sorted_unique(table, self.spill_rows, self.chunk_rows)


def _version_suffixes(sizes: list[int], versions: list[str]) -> list[str]:
    out = []
    for s, v in zip(sizes, versions, strict=True):
        head = f"{s}:"
        tag = v[len(head):]
        out.append(tag if v.startswith(head) and not tag.startswith(_LITERAL) else _LITERAL + v)
    return out


def _sorted_unique(table: FileTable, spill_rows: int | None = None,
                   chunk_rows: int | None = None) -> FileTable:
    """The table's rows by URL, the first of equal URLs kept (Python's stable sort).

    Not bounded like the rest: every URL and stored version is a Python string here (~100
    bytes a file) and the numeric columns are read whole, for the one sort. The sorted table
    is built (and spilled) as any other.
    """
    n = len(table)
    urls = [table.url(i) for i in range(n)]
    stored = [table.versions[i] for i in range(n)]
    sizes, formats, comps = table.sizes[:n], table.formats[:n], table.compressions[:n]
    order = sorted(range(n), key=urls.__getitem__)
    keep = [i for k, i in enumerate(order) if k == 0 or urls[i] != urls[order[k - 1]]]
    out = TableBuilder(spill_rows, chunk_rows)
    for lo in range(0, len(keep), PAGE):
        page = keep[lo:lo + PAGE]
        rows = np.array(page, dtype=np.int64)
        page_sizes = sizes[rows].tolist()
        out.add_page([urls[i] for i in page], page_sizes,
                     [_version_of(stored[i], s) for i, s in zip(page, page_sizes, strict=True)],
                     formats[rows].tolist(), comps[rows].tolist())
    assert out.sorted
    return out.finish()


#: rows handled together when a listing comes as one piece (fsspec ``glob``)
PAGE = 4096


def pages(items: Iterable[Any], size: int = PAGE) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last shorter)."""
    page: list[Any] = []
    for item in items:
        page.append(item)
        if len(page) >= size:
            yield page
            page = []
    if page:
        yield page
