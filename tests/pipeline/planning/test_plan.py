"""The partition plan and range snapping: every byte once, every record exactly once."""

from __future__ import annotations

import hashlib
import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.planning.plan as plan_module
from pipeline.planning.filetable import COMPRESSION_CODES, FORMAT_CODES, InputFile, TableBuilder
from pipeline.planning.plan import (
    AUTO_MAX_BYTES,
    AUTO_MIN_BYTES,
    AUTO_PARTITIONS,
    TAIL_GROUP_MAX,
    Partition,
    PartitionPlan,
    auto_partition_bytes,
    byte_ranges,
    plan_partitions,
    row_group_ranges,
    task_groups,
)
from pipeline.readers import ReadOptions, read_partition
from pipeline.readers import text as text_reader
from pipeline.readers.lines import iter_lines
from pipeline.records import Document


@given(st.integers(0, 10**7), st.integers(1000, 10**6))
def test_byte_ranges_tile_the_file(size: int, target: int) -> None:
    ranges = byte_ranges(size, target)
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(e - s <= target for s, e in ranges) or len(ranges) == 1


@given(st.lists(st.integers(0, 5000), max_size=50), st.integers(1, 20000))
def test_row_group_ranges_cover_each_group_once(sizes: list[int], target: int) -> None:
    ranges = row_group_ranges(tuple(sizes), target)
    if not sizes:
        assert ranges == [(0, -1)]
        return
    assert [i for lo, hi in ranges for i in range(lo, hi)] == list(range(len(sizes)))


_files = st.lists(st.tuples(st.sampled_from(["jsonl", "txt", "csv", "parquet"]),
                            st.sampled_from([None, "gzip"]), st.integers(0, 5000),
                            st.lists(st.integers(1, 900), max_size=6)), max_size=6)


@given(_files, st.integers(1, 3000))
def test_plan_is_pure_and_indexes_in_order(files: list, target: int) -> None:
    inputs = [InputFile(f"f{i}.{fmt}", fmt, None if fmt == "parquet" else comp, size,
                        tuple(groups) if fmt == "parquet" else ())
              for i, (fmt, comp, size, groups) in enumerate(files)]
    plan = plan_partitions(inputs, target)
    assert plan == plan_partitions(list(inputs), target)  # pure: same in, same out
    assert [p.index for p in plan] == list(range(len(plan)))
    for f in inputs:
        mine = [q for p in plan for q in p.pieces() if q.url == f.url]
        if f.fmt in ("jsonl", "txt") and f.compression is None:
            assert mine[0].start == 0 and mine[-1].end == f.size
        elif f.fmt == "csv" or f.compression:
            assert [(p.start, p.end) for p in mine] == [(0, -1)]


_line = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b""))


@settings(max_examples=200)
@given(st.lists(_line, max_size=40), st.booleans(), st.integers(1, 200))
def test_every_line_lands_in_exactly_one_range(lines: list[bytes], trailing: bool,
                                               target: int) -> None:
    data = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    whole = [(ln.offset, ln.data) for ln in iter_lines(io.BytesIO(data), 0, -1, 1 << 20)]
    pieces = []
    for s, e in byte_ranges(len(data), target):
        pieces += [(ln.offset, ln.data) for ln in iter_lines(io.BytesIO(data), s, e, 1 << 20)]
    assert pieces == whole


_para_line = st.text(alphabet="ab \t", min_size=0, max_size=12)


@settings(max_examples=200)
@given(st.lists(_para_line, max_size=40), st.integers(1, 120))
def test_every_paragraph_lands_in_exactly_one_range(lines: list[str], target: int) -> None:
    data = "\n".join(lines).encode()
    opts = ReadOptions()

    def read(s: int, e: int) -> list[str]:
        part = Partition(0, "t.txt", "txt", None, s, e)
        return [d.text for d in text_reader.read(io.BytesIO(data), part, "t.txt", opts, [0])
                if isinstance(d, Document)]

    whole = read(0, -1)
    assert [p for s, e in byte_ranges(len(data), target) for p in read(s, e)] == whole
    assert all(t.strip() for t in whole)


@given(st.integers(min_value=0, max_value=1 << 50))
def test_auto_partition_size_is_bounded_and_gives_enough_partitions(total: int) -> None:
    size = auto_partition_bytes(total)
    assert AUTO_MIN_BYTES <= size <= AUTO_MAX_BYTES
    parts = len(byte_ranges(total, size))
    if AUTO_MIN_BYTES * AUTO_PARTITIONS <= total <= AUTO_MAX_BYTES * AUTO_PARTITIONS:
        assert parts == AUTO_PARTITIONS  # enough tasks to keep every worker busy to the end
    elif total > AUTO_MAX_BYTES * AUTO_PARTITIONS:
        assert parts > AUTO_PARTITIONS


@given(st.integers(min_value=0, max_value=1 << 50), st.integers(min_value=0, max_value=1 << 50))
def test_auto_partition_size_grows_with_the_input(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert auto_partition_bytes(lo) <= auto_partition_bytes(hi)
    assert auto_partition_bytes(hi) == AUTO_MAX_BYTES or hi < AUTO_MAX_BYTES * AUTO_PARTITIONS


def test_auto_partition_size_bounds_and_the_demo_corpus() -> None:
    assert AUTO_MIN_BYTES == 1 << 20 and AUTO_MAX_BYTES == 1 << 30
    assert auto_partition_bytes(0) == AUTO_MIN_BYTES
    assert auto_partition_bytes(9_562_119) == AUTO_MIN_BYTES  # Shakespeare: as before
    assert auto_partition_bytes(64 << 30) == 1 << 30
    assert auto_partition_bytes(50 << 40) == 1 << 30  # 50 TiB: 51,200 partitions of 1 GiB


@given(st.integers(0, 20_000), st.integers(1, 2_000))
def test_task_groups_tile_the_partitions_and_keep_every_worker_busy(n: int, workers: int) -> None:
    groups = task_groups(n, workers)
    assert [i for lo, hi in groups for i in range(lo, hi)] == list(range(n))
    sizes = [hi - lo for lo, hi in groups]
    assert all(1 <= s <= TAIL_GROUP_MAX for s in sizes)
    assert max(sizes, default=0) - min(sizes, default=0) <= 1
    assert len(groups) >= min(n, 2 * workers)  # every worker gets two tasks where it can
    if n >= 8 * workers * TAIL_GROUP_MAX:
        assert len(groups) <= 2 * n // TAIL_GROUP_MAX  # far fewer tasks than partitions


_small_files = st.lists(st.tuples(st.sampled_from(["jsonl", "txt", "csv", "parquet", "warc"]),
                                  st.sampled_from([None, "gzip"]), st.integers(0, 3000),
                                  st.lists(st.integers(1, 900), max_size=4)), max_size=40)


def _inputs(files: list) -> list[InputFile]:
    return [InputFile(f"/d/f{i:03d}.{fmt}", fmt, None if fmt == "parquet" else comp, size,
                      tuple(groups) if fmt == "parquet" else (), f"{size}:t{i}")
            for i, (fmt, comp, size, groups) in enumerate(files)]


@settings(max_examples=200, deadline=None)
@given(_small_files, st.integers(1, 5000), st.integers(1, 6), st.integers(1, 9))
def test_packed_compact_plan_is_the_reference_across_chunks(files: list, target: int,
                                                             max_files: int,
                                                             chunk: int) -> None:
    """The vectorised plan (a run of small files carried from one chunk of the table to the
    next) equals the reference loop, partitions and keys, for any chunk size."""
    inputs = _inputs(files)
    b = TableBuilder()
    b.add_page([f.url for f in inputs], [f.size for f in inputs], [f.version for f in inputs],
               [FORMAT_CODES.index(f.fmt) for f in inputs],
               [COMPRESSION_CODES.index(f.compression) for f in inputs])
    table = b.finish()
    table.row_groups = {i: f.row_groups for i, f in enumerate(inputs) if f.fmt == "parquet"}
    saved = plan_module._PLAN_CHUNK
    plan_module._PLAN_CHUNK = chunk
    try:
        plan = PartitionPlan(table, target, max_files)
    finally:
        plan_module._PLAN_CHUNK = saved
    listed = plan_partitions(inputs, target, max_files)
    assert plan[:] == listed
    assert [plan.key(i, "s") for i in range(len(plan))] == [p.key("s") for p in listed]


@settings(max_examples=200, deadline=None)
@given(_small_files, st.integers(1, 5000), st.integers(1, 6))
def test_packing_covers_each_file_once_and_bounds_a_partition(files: list, target: int,
                                                              max_files: int) -> None:
    inputs = _inputs(files)
    plan = plan_partitions(inputs, target, max_files)
    unpacked = plan_partitions(inputs, target, 1)
    # the same pieces, in the same order: packing only groups them
    assert [(q.url, q.start, q.end) for p in plan for q in p.pieces()] == \
        [(p.url, p.start, p.end) for p in unpacked]
    size = {f.url: f.size for f in inputs}
    for p in plan:
        if p.members:
            pieces = p.pieces()
            assert 2 <= len(pieces) <= max_files
            assert all(size[q.url] < target for q in pieces)
            assert sum(size[q.url] for q in pieces) < 2 * target
    if max_files == 1:
        assert plan == unpacked and not any(p.members for p in plan)


def test_small_files_pack_to_about_the_target() -> None:
    """10 MB files at a 1 GiB target: ~100 files a partition, not one partition each."""
    inputs = [InputFile(f"/d/{i:05d}.txt", "txt", None, 10 << 20, (), "") for i in range(1000)]
    plan = plan_partitions(inputs, 1 << 30)
    assert len(plan) == 10  # 1000 x 10 MiB / 1 GiB, rounded up
    assert all(len(p.pieces()) in (102, 103) for p in plan[:-1])
    assert len(plan_partitions(inputs, 1 << 30, max_files=8)) == 125


def test_a_one_file_partition_keeps_its_key() -> None:
    """Packing added a field; a partition of one file hashes as before (reruns of existing
    datasets find their finished work)."""
    part = Partition(3, "/d/a.txt", "txt", None, 0, 10, "10:x")
    blob = json.dumps([{"compression": None, "end": 10, "fmt": "txt", "index": 3, "start": 0,
                        "url": "/d/a.txt", "version": "10:x"}, "salt"], sort_keys=True)
    assert part.key("salt") == hashlib.sha256(blob.encode()).hexdigest()[:24]


def test_a_packed_partition_reads_its_files_in_order(tmp_path) -> None:
    for name, body in (("a.txt", "alpha\n\nbeta\n"), ("b.jsonl", '{"text": "gamma"}\n'),
                       ("c.txt", "delta\n")):
        (tmp_path / name).write_text(body)
    inputs = [InputFile(str(tmp_path / n), n.rsplit(".", 1)[1], None,
                        (tmp_path / n).stat().st_size, (), "")
              for n in ("a.txt", "b.jsonl", "c.txt")]
    [packed] = plan_partitions(inputs, 1 << 20)
    assert len(packed.pieces()) == 3
    docs = [d for d in read_partition(packed, ReadOptions()) if isinstance(d, Document)]
    assert [d.text for d in docs] == ["alpha", "beta", "gamma", "delta"]
    alone = [d for p in plan_partitions(inputs, 1 << 20, 1)
             for d in read_partition(p, ReadOptions()) if isinstance(d, Document)]
    assert [d.doc_id for d in docs] == [d.doc_id for d in alone]
