"""Row group -> shard and number in it, from ``first_group`` alone (no per-row-group array),
and the per-row-group arrays derived from token offsets: the same as the arrays they replace."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from loaders.row_groups import GroupOf, RowGroupIndex, ShardOf
from loaders.source import GroupPlan, samples_from_starts, smallest_uint

groups_per_shard = st.lists(st.integers(0, 6), min_size=1, max_size=20).filter(any)


@given(groups_per_shard, st.data())
def test_shard_and_group_lookups_are_the_repeated_arrays(counts, data) -> None:
    first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n = int(first[-1])
    shard_of = np.repeat(np.arange(len(counts)), counts)  # the arrays these replace
    group_of = np.arange(n) - first[shard_of]
    picks = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=30)), dtype=np.int64)
    assert ShardOf(first)[picks].tolist() == shard_of[picks].tolist()
    assert GroupOf(first)[picks].tolist() == group_of[picks].tolist()
    g = data.draw(st.integers(-n, n - 1))  # ints too, negative ones from the end
    assert ShardOf(first)[g] == int(shard_of[g]) and GroupOf(first)[g] == int(group_of[g])
    assert len(ShardOf(first)) == n


@given(st.lists(st.integers(0, 70_000), max_size=50), st.integers(1, 300), st.integers(1, 7))
def test_samples_from_starts_in_chunks_are_counts_and_their_prefix_sums(tokens, seq_len,
                                                                        chunk) -> None:
    starts = RowGroupIndex.arrays(np.array(tokens, dtype=np.uint32), np.array([0, len(tokens)]))
    got = samples_from_starts(starts["starts"], seq_len, chunk)
    want = np.array(tokens, dtype=np.int64) // (seq_len + 1)
    assert got["group_samples"].tolist() == want.tolist()
    assert got["group_samples"].dtype == smallest_uint(int(want.max()) if tokens else 0)
    assert got["group_samples"].dtype == GroupPlan.count_samples(
        np.array(tokens, dtype=np.uint32), seq_len).dtype
    assert got["first_sample"].tolist() == [0, *np.cumsum(want).tolist()]


def test_smallest_uint_holds_the_top_value() -> None:
    assert [smallest_uint(v) for v in (0, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32)] == [
        np.uint8, np.uint8, np.uint16, np.uint16, np.uint32, np.uint32, np.int64]


def test_a_small_index_gives_the_read_columns_with_the_plans(tiny_dataset: str) -> None:
    """An index that comes in one GET is read once: the read columns are taken from the same
    bytes at open (no second request on the first read), equal to reading them apart."""
    from storage import ReplicaSet
    from storage.format.index import LOADER_READ_COLUMNS
    from storage.io.index_store import fetch_columns

    store = ReplicaSet.from_urls([tiny_dataset])
    manifest = store.read_manifest()
    index = RowGroupIndex.open(store, manifest)
    assert index._locations is not None  # noqa: SLF001 (what open took, before any read)
    apart = fetch_columns(store, manifest.index, LOADER_READ_COLUMNS)
    got = index.locations(store)
    assert np.array_equal(got.offset, apart["offset"])
    assert np.array_equal(got.digest, apart["digest"]) and got.paths
