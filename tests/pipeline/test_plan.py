"""The partition plan and range snapping: every byte once, every record exactly once."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.discovery import InputFile
from pipeline.plan import (
    AUTO_MAX_BYTES,
    AUTO_MIN_BYTES,
    AUTO_PARTITIONS,
    TAIL_GROUP_MAX,
    Partition,
    auto_partition_bytes,
    byte_ranges,
    plan_partitions,
    row_group_ranges,
    task_groups,
)
from pipeline.readers import ReadOptions
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
        mine = [p for p in plan if p.url == f.url]
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
