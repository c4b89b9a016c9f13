"""The compact file table and partition plan: the same files, partitions and keys as the
list-of-objects forms they replace, whatever the listing's page sizes and order."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.planning.discovery import InputFile, discover_table, read_inputs_from
from pipeline.planning.filetable import COMPRESSION_CODES, FORMAT_CODES, TableBuilder
from pipeline.planning.plan import PartitionPlan, plan_partitions
from pipeline.records import InputError

_names = st.text(st.sampled_from("ab/._-é日0"), min_size=1, max_size=12)
_row = st.tuples(_names, st.sampled_from(["jsonl", "txt", "csv", "parquet"]),
                 st.sampled_from([None, "gzip", "zstd"]), st.integers(0, 2**52),
                 st.one_of(st.none(), st.text(max_size=6)),
                 st.lists(st.integers(1, 900), max_size=5))


def _build(rows: list, page: int, **builder: int) -> tuple[list[InputFile], object]:
    """The table from ``rows`` in pages of ``page``, and the files the old code would list
    (sorted by URL, first of equal URLs kept). ``builder``: TableBuilder's spill_rows and
    chunk_rows."""
    files: dict[str, InputFile] = {}
    b = TableBuilder(**builder)
    for lo in range(0, len(rows), page):
        chunk = rows[lo:lo + page]
        urls = [f"s3://bkt/{name}.{fmt}" for name, fmt, *_ in chunk]
        sizes = [size for _, _, _, size, _, _ in chunk]
        versions = [f"{size}:{tag}" if tag is not None and tag != "x" else f"v{tag}"
                    for _, _, _, size, tag, _ in chunk]
        comps = [None if fmt == "parquet" else comp for _, fmt, comp, *_ in chunk]
        b.add_page(urls, sizes, versions, [FORMAT_CODES.index(f) for _, f, *_ in chunk],
                   [COMPRESSION_CODES.index(c) for c in comps])
        for u, (_, fmt, _, size, _, groups), v, c in zip(urls, chunk, versions, comps,
                                                         strict=True):
            files.setdefault(u, InputFile(u, fmt, c, size,
                                          tuple(groups) if fmt == "parquet" else (), v))
    table = b.finish()
    expect = [files[u] for u in sorted(files)]
    table.row_groups = {i: f.row_groups for i, f in enumerate(expect) if f.fmt == "parquet"}
    return expect, table


@settings(max_examples=150, deadline=None)
@given(st.lists(_row, max_size=30), st.integers(1, 7))
def test_table_holds_the_sorted_unique_files(rows: list, page: int) -> None:
    expect, table = _build(rows, page)
    assert list(table) == expect
    assert table.url_list()[:] == [f.url for f in expect]
    assert table.total_bytes == sum(f.size for f in expect)


@settings(max_examples=150, deadline=None)
@given(st.lists(_row, max_size=20), st.integers(1, 7), st.integers(1, 2**31))
def test_compact_plan_is_the_list_plan(rows: list, page: int, target: int) -> None:
    expect, table = _build(rows, page)
    plan = PartitionPlan(table, target)  # type: ignore[arg-type]
    if len(plan) > 5000:  # too many byte ranges to list: see the test below
        return
    listed = plan_partitions(expect, target)
    assert len(plan) == len(listed)
    assert plan[:] == listed
    salt = '{"a": "é\\"x"}'
    assert [plan.key(i, salt) for i in range(len(plan))] == [p.key(salt) for p in listed]
    assert plan.keys(salt)[:] == [p.key(salt) for p in listed]


@given(st.integers(0, 2**52), st.integers(1, 2**30), st.data())
def test_byte_ranges_without_overflow(size: int, target: int, data: st.DataObject) -> None:
    """Huge files: partition ``j``'s bounds equal ``size * j // n`` exactly."""
    b = TableBuilder()
    b.add_page(["/x.txt"], [size], [f"{size}:0"], [FORMAT_CODES.index("txt")], [0])
    plan = PartitionPlan(b.finish(), target)
    j = data.draw(st.integers(0, len(plan) - 1))
    n = len(plan)
    assert plan[j].start == size * j // n and plan[j].end == size * (j + 1) // n


def test_inputs_from_file_text_csv_jsonl(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "list.txt").write_text(
        f"# inputs\ns3://b/z.jsonl 10 etag1\n\n{tmp_path / 'a.txt'}\t1\ns3://b/y.txt.gz 5\n")
    (tmp_path / "list.csv").write_text("url,size,version\ns3://b/z.jsonl,10,etag1\n")
    (tmp_path / "list.jsonl").write_text('{"url": "s3://b/z.jsonl", "size": 10, '
                                         '"version": "etag1"}\n')
    table = discover_table([], inputs_from=str(tmp_path / "list.txt"))
    assert [(f.url, f.fmt, f.compression, f.size, f.version) for f in table] == [
        (str(tmp_path / "a.txt"), "txt", None, 1, "1:None"),
        ("s3://b/y.txt.gz", "txt", "gzip", 5, "5:None"),
        ("s3://b/z.jsonl", "jsonl", None, 10, "10:etag1")]
    for name in ("list.csv", "list.jsonl"):
        assert list(discover_table([], inputs_from=str(tmp_path / name))) == [table[2]]
    # given with a glob: merged, sorted, each URL once
    both = discover_table([str(tmp_path / "*.txt")], inputs_from=str(tmp_path / "list.csv"))
    assert [f.url for f in both] == sorted({str(tmp_path / "a.txt"),
                                            str(tmp_path / "list.txt"), "s3://b/z.jsonl"})
    (tmp_path / "bad.txt").write_text("s3://b/z.jsonl ten\n")
    with pytest.raises(InputError, match="line 1: expected URL SIZE"):
        list(read_inputs_from(str(tmp_path / "bad.txt")))



def test_a_paged_listing_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A glob over a filesystem with ``ls_pages`` is filtered page by page (fsspec's glob,
    which would hold the whole listing, is never called)."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class PagedFS(MemoryFileSystem):
        protocol = "pagedtest"
        pages_served = 0

        @classmethod
        def _strip_protocol(cls, path: str) -> str:
            return "/" + path.removeprefix("pagedtest://").lstrip("/")

        def ls_pages(self, folder: str):  # type: ignore[no-untyped-def]
            names = sorted(self.ls(folder, detail=True), key=lambda i: i["name"])
            for lo in range(0, len(names), 3):
                type(self).pages_served += 1
                yield names[lo:lo + 3]

        def glob(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise AssertionError("glob called")

    fsspec.register_implementation("pagedtest", PagedFS, clobber=True)
    fs = PagedFS()
    for i in range(10):
        fs.pipe(f"/d/f{i}.jsonl", b"x" * i)
    fs.pipe("/d/other.csv", b"y")
    table = discover_table(["pagedtest:///d/*.jsonl"])
    assert [f.url for f in table] == [f"pagedtest:///d/f{i}.jsonl" for i in range(10)] or \
        [f.url for f in table] == [f"pagedtest://d/f{i}.jsonl" for i in range(10)]
    assert [f.size for f in table] == list(range(10))
    assert PagedFS.pages_served == 4



@given(st.lists(st.tuples(st.sampled_from(["s3://b/raw/", "data/v1.2/", "x/", ""]),
                          st.text("ab", max_size=3),
                          st.sampled_from(["", ".b", ".v1", ".jsonl", ".TXT"]),
                          st.sampled_from([".jsonl", ".json", ".txt", ".Txt", ".csv"]),
                          st.sampled_from(["", ".gz", ".zst", ".xz", ".GZ"])),
                min_size=1, max_size=20), st.booleans())
@settings(max_examples=300, deadline=None)
def test_page_codes_are_each_names_format(names: list, one_folder: bool) -> None:
    """A listing page's format codes, found once per page where the names end alike, are
    detect_format's for every name (mixed endings such as .txt.gz and .jsonl.gz included)."""
    from pipeline.planning.discovery import _page_codes, detect_format

    if one_folder:  # a listing page of one folder (the joined-names path)
        names = [(names[0][0], *rest) for _, *rest in names]
    urls = ["".join(parts) for parts in names]
    want = {u: (FORMAT_CODES.index(detect_format(u)[0]),
                COMPRESSION_CODES.index(detect_format(u)[1])) for u in urls}
    for page in (urls, sorted(urls)):
        fmts, comps = _page_codes(page, {})
        assert list(zip(fmts, comps, strict=True)) == [want[u] for u in page]


# --- spilled tables: the columns in temporary files, read back a chunk at a time ---------


def _columns(table) -> tuple:  # type: ignore[no-untyped-def]
    return (table.sizes[:].tolist(), table.formats[:].tolist(),
            table.compressions[:].tolist())


@settings(max_examples=150, deadline=None)
@given(st.lists(_row, max_size=40), st.integers(1, 7), st.integers(0, 12), st.integers(1, 5),
       st.data())
def test_a_spilled_table_holds_the_same_rows(rows: list, page: int, spill_rows: int,
                                             chunk_rows: int, data: st.DataObject) -> None:
    """Past ``spill_rows`` the columns go to temporary files (sorted or not, so the re-sort
    of an unsorted listing is covered); every row, column slice and scan is the in-memory
    table's, read in any order across chunk boundaries."""
    expect, held = _build(rows, page, spill_rows=10**9)
    _, spilled = _build(rows, page, spill_rows=spill_rows, chunk_rows=chunk_rows)
    assert not held.spilled  # type: ignore[attr-defined]
    assert spilled.spilled == (len(expect) > spill_rows)  # type: ignore[attr-defined]
    n = len(expect)
    order = data.draw(st.permutations(range(n)))
    assert [spilled[i] for i in order] == [expect[i] for i in order]  # type: ignore[index]
    assert list(spilled) == expect  # type: ignore[call-overload]
    assert _columns(spilled) == _columns(held)
    for col in ("sizes", "formats", "compressions"):
        a, b = getattr(held, col), getattr(spilled, col)
        assert len(b) == n
        lo, hi = data.draw(st.integers(-n - 2, n + 2)), data.draw(st.integers(-n - 2, n + 2))
        step = data.draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        got = b[lo:hi:step]
        assert isinstance(got, np.ndarray) and got.dtype == a.dtype
        assert got.tolist() == a[lo:hi:step].tolist()
        if n:
            i = data.draw(st.integers(-n, n - 1))
            assert b[i] == a[i] and b[np.int64(i)] == a[i]
        with pytest.raises(IndexError):
            b[n]
    t, h = spilled, held
    assert t.total_bytes == h.total_bytes == sum(f.size for f in expect)  # type: ignore[attr-defined]
    limit = data.draw(st.one_of(st.none(), st.integers(0, 5)))
    assert t.empty_urls(limit) == h.empty_urls(limit)  # type: ignore[attr-defined]
    for code in range(len(FORMAT_CODES)):
        assert t.any_format(code) == any(f.fmt == FORMAT_CODES[code] for f in expect)  # type: ignore[attr-defined]
        assert t.indices_of_format(code).tolist() == [  # type: ignore[attr-defined]
            i for i, f in enumerate(expect) if f.fmt == FORMAT_CODES[code]]
    t.close()  # type: ignore[attr-defined]
    assert t.spill_bytes() == 0  # type: ignore[attr-defined]


def test_slices_across_chunk_boundaries_and_plan_on_a_spilled_table() -> None:
    """A spilled table of 1,000 files read back 7 rows at a time: every slice of the columns
    (within a chunk, across several, at the ends), URLs in and out of order, and a
    PartitionPlan over it equal to the in-memory table's."""
    n, page = 1000, 64

    def build(**kw: int):  # type: ignore[no-untyped-def]
        b = TableBuilder(**kw)
        for lo in range(0, n, page):
            idx = range(lo, min(n, lo + page))
            b.add_page([f"s3://b/d{i // 300}/f{i:05d}{'é' if i % 11 == 0 else ''}.txt"
                        for i in idx], [i * 37 % 1000 for i in idx],
                       [f"{i * 37 % 1000}:e{i % 5}" for i in idx],
                       [i % len(FORMAT_CODES) if i % len(FORMAT_CODES) != 3 else 1
                        for i in idx], [i % 3 for i in idx])
        return b.finish()

    held, table = build(spill_rows=10**9), build(spill_rows=100, chunk_rows=7)
    assert table.spilled and not held.spilled
    assert table.spill_bytes() >= n * (8 + 1 + 1 + 8 + 8)  # the columns and two offsets
    for lo, hi in [(0, 7), (6, 8), (7, 14), (3, 52), (0, n), (993, n), (999, 1200), (500, 500),
                   (-20, -3), (13, 6)]:
        for col in ("sizes", "formats", "compressions"):
            assert getattr(table, col)[lo:hi].tolist() == getattr(held, col)[lo:hi].tolist()
    for i in [999, 0, 6, 7, 500, 13, 14, 998]:
        assert table.url(i) == held.url(i) and table.version(i) == held.version(i)
    assert table.url_list()[5:30] == held.url_list()[5:30]
    assert PartitionPlan(table, 300)[:] == PartitionPlan(held, 300)[:]
    assert PartitionPlan(table, 300).keys("s")[:] == PartitionPlan(held, 300).keys("s")[:]


def _spill_fds(folder: Path) -> list[str]:
    """This process's open files that live (or lived: unlinked) in ``folder``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


def test_the_spill_files_live_in_tmpdir_and_go_with_the_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary files are made in TMPDIR, without a name there (nothing is left in the
    folder whatever ends the process), and are freed by close() or by collecting the
    table; reading a closed table fails."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again

    def build(rows: int):  # type: ignore[no-untyped-def]
        b = TableBuilder(spill_rows=10, chunk_rows=4)
        b.add_page([f"/d/f{i:03d}.jsonl" for i in range(rows)], list(range(rows)), None,
                   [0] * rows, [0] * rows, tags=["t"] * rows)
        return b.finish()

    table = build(50)
    assert table.spilled and table.spill_bytes() > 50 * 10
    assert _spill_fds(tmp_path) and os.listdir(tmp_path) == []
    assert f"MB in temporary files under {tmp_path} (read back 4 rows" in table.spill_note()
    assert table.url(49) == "/d/f049.jsonl"
    table.close()
    assert _spill_fds(tmp_path) == [] and table.spill_bytes() == 0
    with pytest.raises((OSError, ValueError)):
        table.url(3)
    with build(50) as again:
        assert again.total_bytes == sum(range(50)) and _spill_fds(tmp_path)
    assert _spill_fds(tmp_path) == []
    collected = build(50)
    assert _spill_fds(tmp_path)
    del collected
    gc.collect()
    assert _spill_fds(tmp_path) == []
    small = build(10)  # at the threshold: in memory, no file
    assert not small.spilled and small.spill_bytes() == 0 and _spill_fds(tmp_path) == []


_RSS_CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from pipeline.planning.filetable import TableBuilder

def hwm(key):
    return int([ln for ln in open("/proc/self/status") if ln.startswith(key)][0].split()[1])

rows, spill = int(sys.argv[1]), sys.argv[2] == "spill"
b = TableBuilder(spill_rows=4096 if spill else 10**12)
urls = ["s3://bucket/corpus/2024/f%09d.jsonl" % i for i in range(1000)]  # one page, warm
b.add_page(urls, [7] * 1000, None, [0] * 1000, [0] * 1000, tags=["17"] * 1000)
start = hwm("VmRSS:")
for lo in range(1000, rows, 1000):
    urls = ["s3://bucket/corpus/2024/f%09d.jsonl" % i for i in range(lo, lo + 1000)]
    b.add_page(urls, [7] * 1000, None, [0] * 1000, [0] * 1000, tags=["17"] * 1000)
t = b.finish()
assert t.total_bytes == 7 * rows and t.url(rows - 1).endswith("%09d.jsonl" % (rows - 1))
for i in range(0, rows, 97):  # a pass over the whole table, as a rerun's planning makes
    t.url(i), t.version(i), t.sizes[i]
print(t.spilled, (hwm("VmHWM:") - start) / 1024, t.nbytes() / 2**20, t.spill_bytes() / 2**20)
"""


def test_a_spilled_table_does_not_grow_the_process() -> None:
    """Fresh processes fill a table of 0.25 M and 1.5 M files and read it through: held in
    memory, 1.5 M files grow the peak RSS by about the table's size (~35 MB); spilled, by a
    few chunks (~5 MB), the same at 0.25 M and 1.5 M files."""
    root = str(Path(__file__).resolve().parents[3])
    runs = [(250_000, "spill"), (1_500_000, "spill"), (1_500_000, "memory")]
    procs = [subprocess.Popen([sys.executable, "-c", _RSS_CHILD.format(root=root), str(rows),
                               mode], stdout=subprocess.PIPE, text=True) for rows, mode in runs]
    out = []
    for (rows, mode), proc in zip(runs, procs, strict=True):
        stdout, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, (rows, mode, stdout)
        spilled, growth, table_mb, spill_mb = stdout.split()
        assert spilled == str(mode == "spill")
        out.append((float(growth), float(table_mb), float(spill_mb)))
    (small, _, _), (big, table_mb, spill_mb), (held, _, _) = out
    assert table_mb > 30 and spill_mb >= table_mb, out  # the table is on disk, not here
    assert held > 25, out  # the measurement sees a table held in memory
    assert big < 12 and big - small < 3, out  # spilled: O(chunk), not O(files)
