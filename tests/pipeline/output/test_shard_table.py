"""The driver's compact shard table writes the same index as the ``ShardInfo`` objects it
replaces, whatever order results arrive in, at a tenth of the memory."""

from __future__ import annotations

import os
import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.output.shard_table import ShardTable
from pipeline.tasks import work
from storage import RowGroupInfo, ShardInfo, Totals
from storage.format.chunk_footer import CODECS
from storage.format.index import build_index, digest_algorithm, encode

HEX = st.binary(min_size=32, max_size=32).map(bytes.hex)
GROUPS = st.builds(RowGroupInfo, rows=st.integers(0, 2**32 - 1),
                   tokens=st.integers(0, 2**32 - 1), offset=st.integers(0, 2**63 - 1),
                   length=st.integers(0, 2**32 - 1), sha256=HEX,
                   blake3=st.one_of(st.just(""), HEX))
SHARDS = st.builds(ShardInfo, path=st.text("abc/-_.0123456789", min_size=1, max_size=40),
                   rows=st.integers(0, 2**40), tokens=st.integers(0, 2**40),
                   bytes=st.integers(0, 2**40), sha256=HEX,
                   row_groups=st.lists(GROUPS, max_size=6).map(tuple),
                   footer_length=st.integers(0, 2**31), footer_sha256=st.one_of(st.just(""), HEX),
                   codec=st.sampled_from(["", *CODECS]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.none(), SHARDS), max_size=8), st.randoms(use_true_random=False),
       st.booleans(), st.lists(st.tuples(st.integers(0, 7), st.one_of(st.none(), SHARDS)),
                               max_size=4))
def test_the_table_writes_the_index_of_its_shards(shards: list[ShardInfo | None],
                                                   rng: random.Random, all_blake3: bool,
                                                   stale: list[tuple[int, ShardInfo | None]]
                                                   ) -> None:
    """Partitions (``None``: no rows, no shard) folded in any order, some after an earlier
    result for the same partition (``stale``: replaced, or forgotten), give the bytes,
    reference, digest algorithm and totals of the shards in partition order."""
    if all_blake3:  # the usual case: every row group has a BLAKE3
        shards = [s if s is None else ShardInfo(**{**s.__dict__, "row_groups": tuple(
            RowGroupInfo(g.rows, g.tokens, g.offset, g.length, g.sha256, g.blake3 or g.sha256)
            for g in s.row_groups)}) for s in shards]
    results = work.PhaseTwoResults()
    arrival = list(enumerate(shards))
    rng.shuffle(arrival)
    for index, shard in stale:  # before every partition's last result
        if index < len(shards):
            results.add(work.PhaseTwo(index, shard))
    for index, shard in arrival:
        results.add(work.PhaseTwo(index, shard))
    ordered = [s for s in shards if s is not None]
    table = results.shards
    assert table.digest_algorithm() == digest_algorithm(ordered)
    data, ref = encode(ordered)
    with table.build_index() as built:
        assert built.read_bytes() == data == build_index(ordered)
        assert built.ref == ref
    assert table.totals() == Totals.of(ordered)
    assert len(results) == len(shards)


def test_a_later_result_for_a_partition_replaces_the_earlier() -> None:
    def shard(tokens: int) -> ShardInfo:
        return ShardInfo("s.parquet", 1, tokens, 10, "0" * 64,
                         (RowGroupInfo(1, tokens, 4, 6, "1" * 64, "2" * 64),))

    results = work.PhaseTwoResults()
    results.add(work.PhaseTwo(0, shard(5), {"exact": 2}))
    results.add(work.PhaseTwo(0, shard(7), {"exact": 3}))
    results.add(work.PhaseTwo(1, None, {"near": 1}))
    assert results.shards.totals().tokens == 7 and len(results.shards) == 1
    assert results.duplicates == {"exact": 3, "near": 1}
    results.add(work.PhaseTwo(0, None))
    assert len(results.shards) == 0 and results.duplicates == {"near": 1}


def test_row_group_counts_beyond_32_bits_are_refused_when_folded() -> None:
    big = ShardInfo("s.parquet", 1, 2**32, 10, "0" * 64,
                    (RowGroupInfo(1, 2**32, 0, 6, "1" * 64, "2" * 64),))
    with pytest.raises(ValueError, match="tokens does not fit in 32 bits"):
        ShardTable().add(0, big)
    with pytest.raises(ValueError, match="tokens does not fit in 32 bits"):
        encode([big])  # the object path refuses the same


def test_the_table_holds_no_row_group_in_memory_and_builds_the_index_a_chunk_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Per row group: ~510 bytes as ``ShardInfo`` objects; folded, none (the records are on
    disk; 16 bytes a partition stay). Building the index holds a chunk: its peak is a small
    part of the object's size, where building it in memory (the objects' path) holds the
    object and its columns."""
    import pipeline.output.index_file as index_file
    import pipeline.output.shard_table as shard_table

    def shards(n: int, groups: int) -> list[ShardInfo]:
        return [ShardInfo(f"shards/{k:08d}-{os.urandom(8).hex()}.parquet", 10**5, 10**8,
                          10**8, os.urandom(32).hex(),
                          tuple(RowGroupInfo(127, 262_144, i * 400_000 + 4, 400_000,
                                             os.urandom(32).hex(), os.urandom(32).hex())
                                for i in range(groups)), 5000, os.urandom(32).hex(), "ZSTD")
                for k in range(n)]

    monkeypatch.setattr(shard_table, "CHUNK_GROUPS", 1024)
    monkeypatch.setattr(shard_table, "READ_BYTES", 128 << 10)
    monkeypatch.setattr(index_file, "_COPY", 256 << 10)
    n, groups = 40, 2000
    objects = shards(n, groups)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = ShardTable()
        for i, s in enumerate(objects):
            table.add(i, s)
        folded = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        built = table.build_index()
        streamed_peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        data = build_index(objects)
        whole_peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    with built:
        assert built.read_bytes() == data
    per_folded = folded / (n * groups)
    assert per_folded < 1, per_folded
    assert streamed_peak < len(data) / 4, (streamed_peak, len(data))
    assert whole_peak > 4 * streamed_peak, (whole_peak, streamed_peak)
    table.close()


def test_a_missing_or_full_temporary_folder_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The records and the index are made in ``TMPDIR``: without room there the error names
    the folder and says what to set, whichever of the two writes first."""
    import tempfile

    shard = ShardInfo("s.parquet", 1, 5, 10, "0" * 64,
                      (RowGroupInfo(1, 5, 4, 6, "1" * 64, "2" * 64),))
    table = ShardTable()
    table.add(0, shard)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    with pytest.raises(OSError, match=r"row-group index: .*gone.*set TMPDIR"):
        table.build_index()
    with pytest.raises(OSError, match=r"shard table: .*gone.*set TMPDIR"):
        ShardTable().add(0, shard)
    monkeypatch.setattr(tempfile, "tempdir", None)
    with table.build_index() as built:  # the table is still whole
        assert built.read_bytes() == encode([shard])[0]
    table.close()


_KILLED_HOLDING_THE_INDEX = """
import os, signal, sys
from pathlib import Path
from pipeline.output.shard_table import ShardTable
from storage import ReplicaSet, RowGroupInfo, ShardInfo
table = ShardTable()
for i in range(50):
    table.add(i, ShardInfo(f"s{i}.parquet", 1, 5, 10, "0" * 64,
                           tuple(RowGroupInfo(1, 5, 4, 6, "1" * 64, "2" * 64)
                                 for _ in range(200))))
built = table.build_index()
ReplicaSet.from_urls([sys.argv[1]]).put("index.bin", built.path)  # as the commit sends it
print(len(os.listdir(os.environ["TMPDIR"])), built.ref.bytes, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_driver_killed_holding_the_index_leaves_nothing_in_tmpdir(tmp_path) -> None:
    """The object (and the columns before it) are files without a name: a driver killed
    during its commit gives their space back (at 100 TB ~3 GB each time)."""
    import subprocess
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    store = tmp_path / "store"
    store.mkdir()
    proc = subprocess.run([sys.executable, "-c", _KILLED_HOLDING_THE_INDEX, str(store)],
                          env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    listed, size = map(int, proc.stdout.split())
    assert listed == 0 and size > 50 * 200 * 36  # nothing named while the index existed
    assert (store / "index.bin").stat().st_size == size  # and the put read it whole
    assert list(tmp.iterdir()) == []
