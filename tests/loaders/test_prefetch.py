"""Read-ahead: a unit's row groups reach the consumer one by one, as they are decoded."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from loaders import TokenDataset
from loaders.prefetch import PrefetchingWindows
from storage import ChecksumMismatchError

SEQ = 64


class _RecordingReader:
    """A real reader that records the row groups of each call."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.units: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    def fetch_groups(self, groups: list[int],
                     deliver: Callable[[int, np.ndarray], None] | None = None
                     ) -> dict[int, np.ndarray]:
        self.units.append(list(groups))
        return self._reader.fetch_groups(groups, deliver)


class _HeldReader(_RecordingReader):
    """A real reader whose read thread stops after delivering a unit's first row group until
    ``release`` is set (or, with ``fail``, raises there): what a slow decode of the rest of a
    dozen-group unit looks like to the consumer."""

    def __init__(self, reader: Any, fail: bool = False) -> None:
        super().__init__(reader)
        self.fail = fail
        self.release = threading.Event()

    def fetch_groups(self, groups: list[int],
                     deliver: Callable[[int, np.ndarray], None] | None = None
                     ) -> dict[int, np.ndarray]:
        assert deliver is not None
        delivered = 0

        def hold(g: int, arr: np.ndarray) -> None:
            nonlocal delivered
            if delivered == 1:
                if self.fail:
                    raise ChecksumMismatchError(f"row group {g}: held reader fails here")
                if not self.release.wait(20):
                    raise TimeoutError("the consumer never took the first row group")
            delivered += 1
            deliver(g, arr)

        return super().fetch_groups(groups, hold)


def _plain(tiny_dataset: str) -> PrefetchingWindows:
    ds = TokenDataset(tiny_dataset, SEQ, shuffle=False, rank=0, world_size=1,
                      lookahead_groups=1)
    return ds.windows(ds.rank_order())


def _windows(tiny_dataset: str, fail: bool = False) -> tuple[PrefetchingWindows, _HeldReader]:
    windows = _plain(tiny_dataset)
    held = _HeldReader(windows.reader, fail)
    windows.reader = held
    return windows, held


def test_fetch_groups_delivers_each_group_in_order_as_returned(tiny_dataset: str) -> None:
    ds = TokenDataset(tiny_dataset, SEQ, rank=0, world_size=1)
    reader = ds.source.reader
    groups = [g for g in range(len(reader.index))
              if reader.index.shard_of[g] == reader.index.shard_of[0]][:3][::-1]
    assert len(groups) == 3
    got: list[tuple[int, np.ndarray]] = []
    out = reader.fetch_groups(groups, lambda g, arr: got.append((g, arr)))
    assert [g for g, _ in got] == groups
    for g, arr in got:
        assert np.array_equal(arr, out[g]) and len(arr) > 0


def test_first_window_arrives_before_its_unit_is_decoded(tiny_dataset: str) -> None:
    windows, held = _windows(tiny_dataset)
    it = iter(windows)
    try:
        first = next(it)  # would wait for the held rest of the unit (and time out) if whole
        assert not held.release.is_set()
        assert len(held.units[0]) > 1, "the test needs a unit of several row groups"
        assert len(first) == SEQ + 1
    finally:
        held.release.set()
    rest = list(it)
    plain = list(_plain(tiny_dataset))  # the same windows, nothing held
    assert len(rest) + 1 == len(plain)
    assert all(np.array_equal(a, b) for a, b in zip([first, *rest], plain, strict=True))


def test_a_unit_failing_after_its_first_group_fails_the_consumer_there(
        tiny_dataset: str) -> None:
    windows, held = _windows(tiny_dataset, fail=True)
    it = iter(windows)
    taken = 0
    with pytest.raises(ChecksumMismatchError, match="held reader fails here"):
        for _ in it:
            taken += 1
    # the first row group's windows were delivered; the failure came with the second
    first_group_samples = int(held.index.starts[1] - held.index.starts[0]) // (SEQ + 1)
    assert 0 < taken <= first_group_samples + 1


@pytest.mark.parametrize("footers", ["own", "index"])
def test_local_reads_take_the_shards_row_groups_used_soon(
        tiny_dataset: str, footers: str, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Locally under footers made from the index (a large dataset), one call verifies and
    decodes a row group and the same shard's row groups used within
    ``LOCAL_COALESCE_WINDOW`` positions (one footer for them); every row group once, the
    same windows as one call per row group, and no more held at once than that window more.
    Under the shards' own footers, one row group per call."""
    import loaders.prefetch as prefetch

    if footers == "index":
        request.getfixturevalue("index_footers")

    def run(window: int) -> tuple[list[np.ndarray], list[list[int]], PrefetchingWindows]:
        monkeypatch.setattr(prefetch, "LOCAL_COALESCE_WINDOW", window)
        ds = TokenDataset(tiny_dataset, SEQ, rank=0, world_size=1, seed=3)
        windows = ds.windows(ds.rank_order())
        recording = _RecordingReader(windows.reader)
        windows.reader = recording  # type: ignore[assignment]
        return [w.copy() for w in windows], recording.units, windows

    single, single_units, single_w = run(0)
    merged, merged_units, merged_w = run(16)
    if footers == "own":  # the next row group in order when it is the shard's, whatever
        assert merged_w.reader.makes_footers is False  # the setting
        assert merged_units == single_units
        assert max(len(u) for u in merged_units) <= 2  # a row group and the next one
        assert all(np.array_equal(a, b) for a, b in zip(merged, single, strict=True))
        return
    assert merged_w.reader.makes_footers is True
    assert all(len(u) == 1 for u in single_units)
    assert len(merged_units) < len(single_units)
    assert sorted(g for u in merged_units for g in u) == sorted(u[0] for u in single_units)
    shard_of = merged_w.reader.index.shard_of
    assert all(len({int(shard_of[g]) for g in u}) == 1 for u in merged_units)
    assert max(len(u) for u in merged_units) <= merged_w.max_unit_groups
    assert merged_w.max_resident <= single_w.max_resident + 16
    assert len(merged) == len(single)
    assert all(np.array_equal(a, b) for a, b in zip(merged, single, strict=True))
