"""The compact file table and partition plan: the same files, partitions and keys as the
list-of-objects forms they replace, whatever the listing's page sizes and order."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.discovery import InputFile, discover_table, read_inputs_from
from pipeline.filetable import COMPRESSION_CODES, FORMAT_CODES, TableBuilder
from pipeline.plan import PartitionPlan, plan_partitions
from pipeline.records import InputError

_names = st.text(st.sampled_from("ab/._-é日0"), min_size=1, max_size=12)
_row = st.tuples(_names, st.sampled_from(["jsonl", "txt", "csv", "parquet"]),
                 st.sampled_from([None, "gzip", "zstd"]), st.integers(0, 2**52),
                 st.one_of(st.none(), st.text(max_size=6)),
                 st.lists(st.integers(1, 900), max_size=5))


def _build(rows: list, page: int) -> tuple[list[InputFile], object]:
    """The table from ``rows`` in pages of ``page``, and the files the old code would list
    (sorted by URL, first of equal URLs kept)."""
    files: dict[str, InputFile] = {}
    b = TableBuilder()
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
    from pipeline.discovery import _page_codes, detect_format

    if one_folder:  # a listing page of one folder (the joined-names path)
        names = [(names[0][0], *rest) for _, *rest in names]
    urls = ["".join(parts) for parts in names]
    want = {u: (FORMAT_CODES.index(detect_format(u)[0]),
                COMPRESSION_CODES.index(detect_format(u)[1])) for u in urls}
    for page in (urls, sorted(urls)):
        fmts, comps = _page_codes(page, {})
        assert list(zip(fmts, comps, strict=True)) == [want[u] for u in page]
