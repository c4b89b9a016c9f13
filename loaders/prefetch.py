"""Read-ahead over the row groups a reader is about to need.

The sample sequence of a reader is known in advance (it is the plan), so the exact list of row
groups it will touch, in order, and the last sample that needs each one are known too. Groups
are fetched by a small thread pool up to ``lookahead`` groups ahead of use (bounding bytes in
flight), kept while still needed, and dropped right after their last use: each row group is
read once per pass of the plan over it, and memory holds only the groups in use or in flight.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor

import numpy as np

from loaders.coalesce import READAHEAD_BYTES, AdaptiveWindow, UnitPlanner, window_cap
from loaders.reader import RowGroupIndex, TokenReader
from storage import tokens as token_format

#: Row-group requests in flight when the store is remote (at least; ``read_threads`` if more).
REMOTE_IN_FLIGHT = 8
#: From a remote store, a request also takes the row groups of the same shard that are used
#: within this many positions of the order (:mod:`loaders.coalesce`; at most 8x the read-ahead),
#: spanning up to this many bytes: fewer, larger requests for a higher rate, at the cost of
#: holding the early row groups longer (``benchmarks/loader_throughput.py --s3``). That is the
#: first requests' size (a quick first batch); :class:`loaders.coalesce.AdaptiveWindow` then
#: doubles the window while the store keeps up, up to what ``readahead_bytes`` allows.
COALESCE_WINDOW = 128
COALESCE_MAX_BYTES = 16 << 20
#: Locally, where each call decodes under a footer made for it from the index (a dataset
#: above ``loaders.reader.LOCAL_FOOTER_GROUPS``), a read also takes the shard's row groups
#: used within this many positions (at most the look-ahead, up to ``max_unit_groups``; 0:
#: one row group per read): one call, one footer for them. ``shardflow_local_ixf``
#: (``benchmarks/loader_throughput.py``) then reads at 1.04x the default, not 0.85x (9
#: rounds), at ~2 % less CPU per token than one row group per call.
LOCAL_COALESCE_WINDOW = 16
#: Under the shards' own footers (kept per shard) a call's fixed cost is small: a read takes
#: the next row group in order when it is the same shard's, nothing used later (as before
#: the window above; a window of 16 measured no better there: 50 M tokens, 3 x 6 epochs of
#: each, 0.45-0.52 CPU-s all).
LOCAL_OWN_FOOTER_WINDOW = 1
#: the byte span of one request, however far the window grows
COALESCE_MAX_BYTES_CAP = 64 << 20


def decoded_group_bytes(index: RowGroupIndex) -> float:
    """A row group's tokens once decoded, on average (what the read-ahead holds of each)."""
    dtype = token_format.dtype_of(index.encoding)
    itemsize = dtype.itemsize if dtype is not None else 4
    return index.total_tokens / max(1, len(index)) * itemsize


def group_schedule(reader: TokenReader, starts: np.ndarray,
                   seq_len: int) -> tuple[np.ndarray, np.ndarray, list[int], dict[int, int]]:
    """Per sample its first and last row group; the groups in first-use order; last uses.

    Vectorised (NumPy over the ``(sample, group)`` pairs): a Python loop here cost ~2 us per
    sample, a tenth of the decode time of the sample's tokens.
    """
    width = seq_len + 1
    starts = np.asarray(starts, dtype=np.int64)
    first = np.searchsorted(reader.index.starts, starts, side="right") - 1
    last = np.searchsorted(reader.index.starts, starts + width, side="left") - 1
    counts = last - first + 1
    use = np.repeat(np.arange(len(starts)), counts)  # sample index of each pair
    offsets = np.arange(len(use)) - np.repeat(np.cumsum(counts) - counts, counts)
    groups = np.repeat(first, counts) + offsets  # group of each pair, in order of use
    uniq, first_pos = np.unique(groups, return_index=True)
    order = groups[np.sort(first_pos)].tolist()
    # Pairs are in non-decreasing sample order: a group's last use is its last pair.
    last_pos = len(groups) - 1 - np.unique(groups[::-1], return_index=True)[1]
    last_use = dict(zip(uniq.tolist(), use[last_pos].tolist(), strict=True))
    return first, last, order, last_use


class PrefetchingWindows:
    """Iterate the token windows starting at ``starts`` in order, row groups read ahead."""

    def __init__(self, reader: TokenReader, starts: np.ndarray, seq_len: int,
                 lookahead: int = 8, threads: int = 4, max_unit_groups: int = 8,
                 readahead_bytes: int = READAHEAD_BYTES) -> None:
        self.max_unit_groups = max_unit_groups
        self.readahead_bytes = readahead_bytes
        self.reader = reader
        self.starts = np.asarray(starts, dtype=np.int64)
        self.seq_len = seq_len
        self.lookahead = max(1, lookahead)
        self.threads = max(1, threads)
        self.remote = not all(r.loc.is_local for r in reader.store.replicas)
        # From an object store, a request also takes the shard's row groups used soon after
        # (loaders.coalesce): held from then on, so at most ``coalesce_window`` positions early.
        self.coalesce_window = min(COALESCE_WINDOW, 8 * self.lookahead) if self.remote else 0
        if self.remote:
            # An object store answers a ranged GET in ~1-10 ms, most of it waiting: more
            # requests in flight hide that at the same CPU per token
            # (``benchmarks/loader_throughput.py --s3``).
            self.threads = max(self.threads, min(REMOTE_IN_FLIGHT, self.lookahead))
        self.wait_s = 0.0
        self.max_resident = 0  # most row groups held (decoded or in flight) at once
        self.window: AdaptiveWindow | None = None  # the remote coalescing window, once started
        self._done: list[tuple[int, int, float]] = []  # (level, bytes, seconds) per request

    def _window_cap(self) -> int:
        """The largest coalescing window the memory budget allows: a window of ``w`` holds
        up to ``w + lookahead`` decoded row groups."""
        index = self.reader.index
        if not len(index):
            return self.coalesce_window
        return window_cap(self.readahead_bytes, decoded_group_bytes(index), self.lookahead,
                          self.coalesce_window)

    def _fetch_unit(self, unit: list[int], futures: dict[int, Future[np.ndarray]],
                    level: int | None, nbytes: int) -> None:
        """Fetch ``unit`` on a read thread, settling each group's future as it is decoded
        (the first group of a dozen-group unit is ready after its own decode, not the
        unit's); a failure settles every group still pending. ``level``: the coalescing
        level the unit was planned at, timed for :class:`loaders.coalesce.AdaptiveWindow`."""
        t0 = time.perf_counter()
        try:
            self.reader.fetch_groups(unit, lambda g, arr: _settle(futures[g], arr, None))
        except BaseException as exc:  # noqa: BLE001  (handed to the consumer, raised there)
            for fut in futures.values():
                _settle(fut, None, exc)
            return
        if level is not None:
            self._done.append((level, nbytes, time.perf_counter() - t0))  # list.append: atomic

    def _arrival(self, fut: Future[np.ndarray]) -> np.ndarray:
        if fut.done():
            return fut.result()
        t0 = time.perf_counter()
        arr = fut.result()
        self.wait_s += time.perf_counter() - t0
        return arr

    def __iter__(self) -> Generator[np.ndarray, None, None]:
        # The loop below runs once per sample (~100,000 per 200 M tokens), so everything
        # per-sample that NumPy can do is done up front, and a sample inside one row group (all
        # but ~1 % of them at the default sizes) takes a short path with no allocation beyond
        # its view.
        reader, width = self.reader, self.seq_len + 1
        first, last, order, last_use = group_schedule(reader, self.starts, self.seq_len)
        # Each group's position in ``order``: looked up among this piece's groups only
        # (nothing the size of the whole index per piece).
        by_group = np.asarray(order, dtype=np.int64)
        sort = np.argsort(by_group, kind="stable")
        ranked = by_group[sort]

        def position(groups: np.ndarray) -> np.ndarray:
            return sort[np.searchsorted(ranked, groups)]

        need = np.maximum(position(first), position(last))  # exact unless a sample spans 3+
        for i in np.flatnonzero(last - first > 1).tolist():
            need[i] = position(np.arange(first[i], last[i] + 1)).max()
        # Units planned one at a time, as they become due: from a remote store at the window
        # of the moment (AdaptiveWindow), locally at a fixed one.
        where = reader.index.locations(reader.store)
        offset, length = where.offset, where.length
        planner = UnitPlanner(order, reader.index.shard_of, offset, length)
        local_window = min(LOCAL_COALESCE_WINDOW if reader.makes_footers
                           else LOCAL_OWN_FOOTER_WINDOW, self.lookahead)
        adaptive = bool(self.coalesce_window)
        if adaptive:
            window = reader.coalesce_window  # learned by this reader's earlier pieces
            cap = self._window_cap()
            if window is None or (window.start, window.cap) != (self.coalesce_window, cap):
                window = reader.coalesce_window = AdaptiveWindow(
                    self.coalesce_window, cap, COALESCE_MAX_BYTES, COALESCE_MAX_BYTES_CAP)
            self.window = window
            done = self._done
        group_start = dict(zip(order, reader.index.starts[by_group].tolist(), strict=True))
        firsts, lasts, needs = first.tolist(), last.tolist(), need.tolist()
        starts = self.starts.tolist()
        resident: dict[int, Future[np.ndarray]] = {}
        tasks: deque[Future[None]] = deque()  # the read threads' unit tasks not yet finished
        ready: dict[int, np.ndarray] = {}  # decoded groups already taken from their future
        next_fetch, n_order, lookahead = 0, len(order), self.lookahead
        with ThreadPoolExecutor(self.threads, thread_name_prefix="shardflow-read") as pool:
            try:
                for i in range(len(starts)):
                    # Keep `lookahead` groups beyond the current one requested.
                    horizon = needs[i] + lookahead
                    while next_fetch < n_order and next_fetch <= horizon:
                        if adaptive:
                            while done:
                                window.observe(*done.pop(0))
                            unit = planner.unit_at(next_fetch, window.window, window.max_bytes)
                        else:
                            unit = planner.unit_at(next_fetch, local_window,
                                                   COALESCE_MAX_BYTES, self.max_unit_groups)
                        next_fetch += 1
                        if unit is None:  # taken by an earlier unit
                            continue
                        futures: dict[int, Future[np.ndarray]] = {g: Future() for g in unit}
                        if not adaptive:
                            level, span = None, 0
                        else:
                            level = window.level
                            span = (max(int(offset[g] + length[g]) for g in unit)
                                    - min(int(offset[g]) for g in unit))
                        while tasks and tasks[0].done():
                            tasks.popleft()
                        tasks.append(pool.submit(self._fetch_unit, unit, futures, level, span))
                        resident.update(futures)
                        self.max_resident = max(self.max_resident, len(resident))
                    start, a, b = starts[i], firsts[i], lasts[i]
                    if a == b:  # the window lies in one row group: all but ~1 % of samples
                        arr = ready.get(a)
                        if arr is None:
                            arr = ready[a] = self._arrival(resident[a])
                        if last_use[a] == i:
                            del resident[a], ready[a]
                        lo = start - group_start[a]
                        yield arr[lo:lo + width]
                        continue
                    parts = []
                    for g in range(a, b + 1):
                        arr = ready.get(g)
                        if arr is None:
                            arr = ready[g] = self._arrival(resident[g])
                        lo = start - group_start[g]
                        parts.append(arr[max(lo, 0):lo + width])
                        if last_use[g] == i:
                            del resident[g], ready[g]
                    if len(parts) == 1:
                        yield parts[0]
                        continue
                    window = np.concatenate(parts)
                    assert len(window) == width
                    yield window
            finally:
                for task in tasks:  # units not started yet are dropped; running ones finish
                    task.cancel()


def _settle(fut: Future[np.ndarray], arr: np.ndarray | None,
            exc: BaseException | None) -> None:
    """Give a group's future its tokens (or the unit's failure) unless it is settled already."""
    try:
        if exc is None:
            fut.set_result(arr)  # type: ignore[arg-type]
        elif not fut.done():
            fut.set_exception(exc)
    except InvalidStateError:  # settled already (the unit failed after delivering it)
        pass
