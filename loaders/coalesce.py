"""Which row groups go into one request: a pure function of the plan's order and the byte ranges.

A rank's plan fixes the order in which it first uses row groups (:func:`loaders.prefetch.
group_schedule`). Blocks are permuted over the whole dataset, so two row groups that are
neighbours in a shard are rarely neighbours in that order (50 M tokens, 192 groups: a median 40
positions apart). An object store charges per request: on a loopback SeaweedFS a random 290 KB
ranged GET keeps 8 requests in flight at ~100 MB/s, a whole 4.6 MB shard ~800 MB/s (the server
reads a whole stored chunk per request), and S3 charges a round trip and a request fee per GET.

So a *unit* starts with the earliest-used row group not yet planned and takes the other row
groups of the same shard that the rank will use within the next ``window`` positions, while the
unit's byte span stays within ``max_bytes``; the reader then issues one GET per run of pieces
whose holes are at most its ``hole_bytes`` (reading holes through). Members are fetched when
the unit's first group is due, i.e. up to ``window`` positions early: ``window`` x the row-group
size bounds the extra bytes held.

Every row group of ``order`` is in exactly one unit; units are listed in the order their first
group is used, and a unit's members are in order of use.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def plan_units(order: list[int], shard_of: np.ndarray, offset: np.ndarray,
               length: np.ndarray, window: int, max_bytes: int,
               max_groups: int = 64) -> list[list[int]]:
    """Fetch units over ``order`` (row groups in first-use order); see the module docstring.

    ``shard_of``/``offset``/``length`` are indexed by row group. ``window=0`` gives one unit
    per group.
    """
    positions: dict[int, list[int]] = defaultdict(list)  # shard -> positions, ascending
    shards = [int(shard_of[g]) for g in order]
    for p, s in enumerate(shards):
        positions[s].append(p)
    cursor: dict[int, int] = defaultdict(int)  # shard -> index of its next position to look at
    taken = np.zeros(len(order), dtype=bool)
    units: list[list[int]] = []
    for p, g in enumerate(order):
        if taken[p]:
            continue
        taken[p] = True
        s = shards[p]
        unit = [g]
        lo, hi = int(offset[g]), int(offset[g]) + int(length[g])
        mine = positions[s]
        k = cursor[s]
        while k < len(mine) and (mine[k] < p or taken[mine[k]]):
            k += 1
        cursor[s] = k
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
        units.append(unit)
    return units
