"""Which row groups go into one request, and how large requests grow: pure planning.

A rank's plan fixes the order in which it first uses row groups (:func:`loaders.prefetch.
group_schedule`). Blocks are permuted over the whole dataset, so two row groups that are
neighbours in a shard are rarely neighbours in that order (50 M tokens, 192 groups: a median 40
positions apart). An object store charges per request: on a loopback SeaweedFS a random 290 KB
ranged GET keeps 8 requests in flight at ~100 MB/s, a whole 4.6 MB shard ~800 MB/s (the server
reads a whole stored chunk per request), and S3 charges a round trip and a request fee per GET.

So a *unit* starts with the earliest-used row group not yet planned and takes the other row
groups of the same shard that the rank will use within the next ``window`` positions, while the
unit's byte span stays within ``max_bytes``; the reader then issues one GET per run of pieces
whose holes are at most its ``hole_bytes`` (reading holes through), and verifies every row group
against its own digest. Members are fetched when the unit's first group is due, i.e. up to
``window`` positions early: ``window`` x the row-group size bounds the extra bytes held.

:class:`UnitPlanner` plans one unit at a time, so the window may change between units;
:class:`AdaptiveWindow` is the rule that changes it: start at the small window (a quick first
batch), double it while a request of the larger size costs no more time per byte than one of
the size before (the store keeps up), never beyond the window the read-ahead memory budget
allows, and stop growing (back to the last good size) the first time it costs more.
:func:`plan_units` is the fixed-window plan of a whole order.

Every row group of ``order`` is in exactly one unit; units are listed in the order their first
group is used, and a unit's members are in order of use.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

#: The default read-ahead budget (``ReadSettings.readahead_bytes``): decoded row groups a
#: reader from an object store may hold ahead of their use, which bounds how far its requests
#: grow (:func:`window_cap`). A request holds a whole run of ``run_blocks`` row
#: groups only when the window covers a run of each of the reader's lanes, i.e. the budget
#: holds ``(lanes x run_blocks + lookahead)`` decoded row groups: for 8 lanes (a per-rank batch
#: of 8), runs of 64 and the pipeline's 256 Ki uint16 tokens, (8 x 64 + 16) x 512 KiB = 264
#: MiB. At 256 MiB a run went in two requests (62 + 2 row groups: 1.9x litdata's GETs instead
#: of 1.1x, ``benchmarks/request_scale.py``); more lanes per reader want a larger budget.
READAHEAD_BYTES = 320 << 20
#: a larger request may cost up to this much more time per byte and still count as "kept up"
#: (a loaded host's noise; a store that throttles or queues large reads costs far more)
GROWTH_TOLERANCE = 1.5
#: requests completed at a size before the next doubling is judged (their median is compared)
GROWTH_SAMPLES = 3


class UnitPlanner:
    """Units over ``order`` (row groups in first-use order), one at a time, in order of use.

    ``shard_of``/``offset``/``length`` are indexed by row group (``shard_of`` by an array of
    them: an array, or :class:`loaders.row_groups.ShardOf`). ``unit_at(p, ...)`` is the
    unit headed by position ``p``, or ``None`` when ``p``'s group went into an earlier unit.
    Positions must be asked for in increasing order.
    """

    def __init__(self, order: list[int], shard_of: np.ndarray, offset: np.ndarray,
                 length: np.ndarray) -> None:
        self.order = order
        self.offset, self.length = offset, length
        self.shards = np.asarray(shard_of[np.asarray(order, dtype=np.int64)]).tolist() \
            if order else []
        self.positions: dict[int, list[int]] = defaultdict(list)  # shard -> its positions
        for p, s in enumerate(self.shards):
            self.positions[s].append(p)
        self.cursor: dict[int, int] = defaultdict(int)  # shard -> next position to look at
        self.taken = np.zeros(len(order), dtype=bool)

    def unit_at(self, p: int, window: int, max_bytes: int,
                max_groups: int = 64) -> list[int] | None:
        if self.taken[p]:
            return None
        order, offset, length, taken = self.order, self.offset, self.length, self.taken
        taken[p] = True
        s = self.shards[p]
        g = order[p]
        unit = [g]
        lo, hi = int(offset[g]), int(offset[g]) + int(length[g])
        mine = self.positions[s]
        k = self.cursor[s]
        while k < len(mine) and (mine[k] < p or taken[mine[k]]):
            k += 1
        self.cursor[s] = k
        for q in mine[k:]:
            if q > p + window or len(unit) >= max_groups:
                break
            if taken[q]:
                continue
            h = order[q]
            a, b = int(offset[h]), int(offset[h]) + int(length[h])
            if max(hi, b) - min(lo, a) > max_bytes:
                continue
            lo, hi = min(lo, a), max(hi, b)
            taken[q] = True
            unit.append(h)
        return unit


def plan_units(order: list[int], shard_of: np.ndarray, offset: np.ndarray,
               length: np.ndarray, window: int, max_bytes: int,
               max_groups: int = 64) -> list[list[int]]:
    """Fetch units over ``order`` with a fixed ``window``; ``window=0`` gives one unit per
    group."""
    planner = UnitPlanner(order, shard_of, offset, length)
    units = (planner.unit_at(p, window, max_bytes, max_groups) for p in range(len(order)))
    return [u for u in units if u is not None]


def window_cap(readahead_bytes: int, group_bytes: float, lookahead: int, start: int) -> int:
    """The largest coalescing window a read-ahead budget of ``readahead_bytes`` allows (never
    below ``start``): a window of ``w`` positions holds up to ``w + lookahead`` decoded row
    groups of ``group_bytes`` each."""
    return max(start, int(readahead_bytes // max(1.0, group_bytes)) - lookahead)


def run_per_lane_bytes(lanes: int, run_blocks: int, lookahead: int, group_bytes: float) -> int:
    """The read-ahead budget whose window (:func:`window_cap`) covers a whole run of each of
    ``lanes`` lanes reading through one reader: ``lanes x run_blocks`` positions, plus the
    look-ahead, of decoded row groups. Below it a run goes in two or more requests
    (``benchmarks/request_scale.py``: 16 lanes at the default 320 MiB, 2.0x litdata's GETs
    per token; at this budget, 520 MiB, 1.1x)."""
    return int((lanes * run_blocks + lookahead) * group_bytes)


def _median(values: list[float]) -> float:
    """The median, as ``np.median`` gives it, without its imports: ``np.median`` imports
    ``numpy.ma`` (~10 ms, on the caller's thread, in the first batches from a remote store)
    and ``statistics`` imports ``fractions``, ``decimal`` and ``random``."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class AdaptiveWindow:
    """The coalescing window of a reader from a remote store, grown while the store keeps up.

    Levels are ``start``, ``2 start``, ``4 start``, ... capped at ``cap`` (the window the
    read-ahead memory budget allows); ``max_bytes`` (a request's byte span) scales with the
    level. Each finished request is :meth:`observe`\\ d with the level it was planned at. When
    ``GROWTH_SAMPLES`` requests of the current level have finished, their median time per byte
    is compared with the level below's: at most ``GROWTH_TOLERANCE`` x it (or no level below
    yet) -> the next level; more -> back to the level below, and no more growth. Pure: the
    levels depend only on the observations given.
    """

    def __init__(self, start: int, cap: int, max_bytes: int, max_bytes_cap: int) -> None:
        self.start = max(1, start)
        self.cap = max(self.start, cap)
        self.base_bytes, self.max_bytes_cap = max_bytes, max(max_bytes, max_bytes_cap)
        self.level = 0
        self.frozen = self.window_at(1) == self.window_at(0)
        self.history: list[int] = [self.window]  # every window taken, in order (for tests)
        self._seen: dict[int, list[float]] = defaultdict(list)  # level -> seconds per byte

    def window_at(self, level: int) -> int:
        return min(self.cap, self.start << level)

    @property
    def window(self) -> int:
        return self.window_at(self.level)

    @property
    def max_bytes(self) -> int:
        return min(self.max_bytes_cap, self.base_bytes * (self.window // self.start))

    def observe(self, level: int, nbytes: int, seconds: float) -> None:
        """A request planned at ``level`` moved ``nbytes`` in ``seconds``."""
        if nbytes <= 0:
            return
        self._seen[level].append(max(seconds, 1e-9) / nbytes)
        if self.frozen or level != self.level or len(self._seen[level]) < GROWTH_SAMPLES:
            return
        here = _median(self._seen[level])
        below = self._seen.get(level - 1)
        if below and here > GROWTH_TOLERANCE * _median(below):
            self.level -= 1  # larger requests cost more per byte: the store did not keep up
            self.frozen = True
        else:
            self.level += 1
            self.frozen = self.window_at(self.level + 1) == self.window
        self.history.append(self.window)
