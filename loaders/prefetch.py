"""Read-ahead over the row groups a reader is about to need.

The sample sequence of a reader is known in advance (it is the plan), so the exact list of row
groups it will touch, in order, and the last sample that needs each one are known too. Groups
are fetched by a small thread pool up to ``lookahead`` groups ahead of use (bounding bytes in
flight), kept while still needed, and dropped right after their last use: each row group is
read once per pass of the plan over it, and memory holds only the groups in use or in flight.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from loaders import plan
from loaders.reader import TokenReader


def group_schedule(reader: TokenReader, samples: np.ndarray,
                   seq_len: int) -> tuple[np.ndarray, np.ndarray, list[int], dict[int, int]]:
    """Per sample its first and last row group; the groups in first-use order; last uses."""
    width = seq_len + 1
    starts = samples.astype(np.int64) * width
    first = np.searchsorted(reader.index.starts, starts, side="right") - 1
    last = np.searchsorted(reader.index.starts, starts + width, side="left") - 1
    order: list[int] = []
    last_use: dict[int, int] = {}
    seen: set[int] = set()
    for i, (a, b) in enumerate(zip(first.tolist(), last.tolist(), strict=True)):
        for g in range(a, b + 1):
            if g not in seen:
                seen.add(g)
                order.append(g)
            last_use[g] = i
    return first, last, order, last_use


def fetch_units(reader: TokenReader, order: list[int], max_groups: int) -> list[list[int]]:
    """Runs of ``order`` that are neighbours in one shard: each is fetched with one GET."""
    units: list[list[int]] = []
    for g in order:
        if (units and len(units[-1]) < max_groups and g == units[-1][-1] + 1
                and reader.index.shard_of[g] == reader.index.shard_of[units[-1][-1]]):
            units[-1].append(g)
        else:
            units.append([g])
    return units


class PrefetchingWindows:
    """Iterate the token windows of ``samples`` in order, with row groups read ahead."""

    def __init__(self, reader: TokenReader, samples: np.ndarray, seq_len: int,
                 lookahead: int = 8, threads: int = 4, max_unit_groups: int = 8) -> None:
        self.max_unit_groups = max_unit_groups
        self.reader = reader
        self.samples = samples
        self.seq_len = seq_len
        self.lookahead = max(1, lookahead)
        self.threads = max(1, threads)
        self.wait_s = 0.0

    def __iter__(self) -> Iterator[np.ndarray]:
        reader, width = self.reader, self.seq_len + 1
        first, last, order, last_use = group_schedule(reader, self.samples, self.seq_len)
        starts_of = reader.index.starts
        position = {g: k for k, g in enumerate(order)}
        units = fetch_units(reader, order, self.max_unit_groups)
        unit_at = {}  # position in `order` of a unit's first group -> unit
        resident: dict[int, Future[dict[int, np.ndarray]]] = {}
        next_fetch = 0
        for unit in units:
            unit_at[position[unit[0]]] = unit
        with ThreadPoolExecutor(self.threads, thread_name_prefix="shardflow-read") as pool:
            try:
                for i, sample in enumerate(self.samples.tolist()):
                    # Keep `lookahead` groups beyond the current one requested.
                    need = max(position[g] for g in range(int(first[i]), int(last[i]) + 1))
                    horizon = need + self.lookahead
                    while next_fetch < len(order) and next_fetch <= horizon:
                        unit = unit_at[next_fetch]
                        fut = pool.submit(reader.fetch_groups, unit)
                        for g in unit:
                            resident[g] = fut
                        next_fetch += len(unit)
                    start, stop = plan.sample_span(sample, self.seq_len)
                    parts = []
                    for g in range(int(first[i]), int(last[i]) + 1):
                        fut = resident[g]
                        if not fut.done():
                            t0 = time.perf_counter()
                            arr = fut.result()[g]
                            self.wait_s += time.perf_counter() - t0
                        else:
                            arr = fut.result()[g]
                        g0 = int(starts_of[g])
                        parts.append(arr[max(start - g0, 0):min(stop - g0, len(arr))])
                        if last_use[g] == i:
                            del resident[g]
                    window = parts[0] if len(parts) == 1 else np.concatenate(parts)
                    assert len(window) == width
                    yield window
            finally:
                for fut in resident.values():
                    fut.cancel()
