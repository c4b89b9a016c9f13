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
``--inputs-from`` file) is sorted once at the end. Parquet files also get their row groups'
byte sizes (one footer read each), kept per Parquet file only.
"""

from __future__ import annotations

import bisect
import operator
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

#: format and compression codes (the index in these tuples)
FORMAT_CODES = ("jsonl", "txt", "csv", "parquet", "warc")
COMPRESSION_CODES = (None, "gzip", "zstd", "bz2", "xz")
#: a version suffix that starts with this holds the whole version string (not ``size:tag``)
_LITERAL = "\x00"


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


class PrefixedStrings:
    """Strings stored as runs of a shared prefix + one blob of UTF-8 suffixes."""

    def __init__(self) -> None:
        self._run_starts: list[int] = []
        self._prefixes: list[str] = []
        self.n = 0
        # one growing buffer each, never a list of per-page pieces (see Growable)
        self._blob: bytearray = bytearray()
        self._ends = Growable(np.uint32)  # 0, then the end of each suffix in the blob
        self._ends.extend([0])
        self._offsets: np.ndarray | None = None

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
        ends += len(self._blob)
        if len(self._blob) + len(blob) >= 2**32 and self._ends.dtype != np.int64:
            self._ends.astype(np.int64)  # past 4 GiB of suffixes
        self._blob += blob
        self._ends.extend(ends)
        self.n += len(items)

    def finish(self) -> PrefixedStrings:
        offsets = self._ends.finish()
        self._offsets = offsets if self._blob else None  # None: every suffix empty
        return self

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> str:
        run = bisect.bisect_right(self._run_starts, i) - 1
        if self._offsets is None:
            return self._prefixes[run]
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        return self._prefixes[run] + self._blob[lo:hi].decode("utf-8")

    def nbytes(self) -> int:
        return len(self._blob) + (0 if self._offsets is None else self._offsets.nbytes) + \
            sum(len(p) + 16 for p in self._prefixes)


@dataclass
class FileTable(Sequence[Any]):
    """The sorted, unique input files (see the module docstring). ``table[i]`` is an
    :class:`pipeline.discovery.InputFile`, made on demand."""

    urls: PrefixedStrings
    versions: PrefixedStrings
    sizes: np.ndarray
    formats: np.ndarray
    compressions: np.ndarray
    #: Parquet files only: file index -> compressed byte size of each row group
    row_groups: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sizes)

    def url(self, i: int) -> str:
        return self.urls[i]

    def version(self, i: int) -> str:
        v = self.versions[i]
        return v[1:] if v.startswith(_LITERAL) else f"{int(self.sizes[i])}:{v}"

    def fmt(self, i: int) -> str:
        return FORMAT_CODES[self.formats[i]]

    def compression(self, i: int) -> str | None:
        return COMPRESSION_CODES[self.compressions[i]]

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        from pipeline.discovery import InputFile

        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return InputFile(self.url(i), self.fmt(i), self.compression(i), int(self.sizes[i]),
                         self.row_groups.get(i, ()), self.version(i))

    def url_list(self) -> UrlView:
        return UrlView(self)

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    def empty_urls(self, limit: int | None = None) -> tuple[int, list[str]]:
        """How many files have 0 bytes, and the URLs of the first ``limit`` of them."""
        zero = np.flatnonzero(self.sizes == 0)
        return len(zero), [self.url(int(i)) for i in zero[:limit]]

    def nbytes(self) -> int:
        """What the table holds (the arrays and blobs; Parquet row groups not counted)."""
        return (self.urls.nbytes() + self.versions.nbytes() + self.sizes.nbytes
                + self.formats.nbytes + self.compressions.nbytes)


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
    """

    def __init__(self) -> None:
        self.urls = PrefixedStrings()
        self.versions = PrefixedStrings()
        self._sizes = Growable(np.int64)
        self._formats = Growable(np.uint8)
        self._compressions = Growable(np.uint8)
        self.sorted = True
        self._last: str | None = None
        self.n = 0

    def add_page(self, urls: list[str], sizes: list[int], versions: list[str] | None,
                 formats: list[int], compressions: list[int],
                 tags: list[str] | None = None) -> None:
        """``tags`` instead of ``versions``: each version is ``f"{size}:{tag}"``."""
        if not urls:
            return
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

    def finish(self) -> FileTable:
        table = FileTable(self.urls.finish(), self.versions.finish(), self._sizes.finish(),
                          self._formats.finish(), self._compressions.finish())
        return table if self.sorted else _sorted_unique(table)


def _version_suffixes(sizes: list[int], versions: list[str]) -> list[str]:
    out = []
    for s, v in zip(sizes, versions, strict=True):
        head = f"{s}:"
        tag = v[len(head):]
        out.append(tag if v.startswith(head) and not tag.startswith(_LITERAL) else _LITERAL + v)
    return out


def _sorted_unique(table: FileTable) -> FileTable:
    """The table's rows by URL, the first of equal URLs kept (Python's stable sort)."""
    urls = [table.url(i) for i in range(len(table))]
    order = sorted(range(len(urls)), key=urls.__getitem__)
    keep = [i for n, i in enumerate(order) if n == 0 or urls[i] != urls[order[n - 1]]]
    out = TableBuilder()
    for lo in range(0, len(keep), PAGE):
        page = keep[lo:lo + PAGE]
        out.add_page([urls[i] for i in page], [int(table.sizes[i]) for i in page],
                     [table.version(i) for i in page], [int(table.formats[i]) for i in page],
                     [int(table.compressions[i]) for i in page])
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
