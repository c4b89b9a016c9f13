"""The sample plan: pure functions over integers, no I/O, no global order.

Samples. A *sample* is a window of ``seq_len + 1`` consecutive tokens (input ``w[:-1]``,
labels ``w[1:]``). Windows lie on a grid inside each row group of the dataset's token stream
(all documents of all shards in manifest order, each ending with EOS): row group ``g`` of
``t_g`` tokens holds ``t_g // (seq_len + 1)`` samples, so windows cross document boundaries
but never row groups, and the last ``t_g % (seq_len + 1)`` tokens of each row group (under 1 %
at the default 256 k-token row groups) are not used. Sample ids number the grid in stream
order. The samples of one row group are a *block*.

One epoch, for a plan of ``L`` *lanes* (every rank derives the same):

1. Blocks are permuted by a keyed Feistel bijection (:class:`loaders.permute.Feistel`, key
   (seed, epoch)), in runs of ``run_blocks`` neighbours moved as one
   (:class:`loaders.permute.RunPermutation`; by default as long as the dataset's size
   allows, :func:`auto_run_blocks`); the permuted blocks, concatenated, give every sample a
   *position* ``0 .. N-1``.
2. Positions are cut into ``L`` lanes of consecutive positions (lane ``j`` starts at
   ``j N // L``), each completed to ``m = ceil(N / L)`` samples by repeating its own last
   sample when it is one short (``L m - N < L`` repeats per epoch, at most one per lane:
   every lane, hence every rank, gets the same number of samples).
3. Within each lane, samples are shuffled inside each *segment*: the positions of one
   window of ``window_blocks`` consecutive permuted blocks that fall in that lane (a keyed
   hash of the position orders them). A lane that starts inside a block takes its first
   segment last, so that the block it shares with the previous lane is used by both near the
   end of the epoch (a reader holds a block from its first use to its last).
4. Global batch ``k`` is samples ``k c .. (k+1) c - 1`` of every lane (``c`` per lane, the
   global batch ``B = c L``); the last one is shorter when ``m`` is not a multiple of ``c``.

Split. Rank ``r`` of ``W`` owns lanes ``r L/W .. (r+1) L/W - 1`` (``W`` must divide ``L``), so
it reads a contiguous 1/W of the permuted blocks, plus the blocks cut by its two ends; its
share of each global batch is its lanes' samples, lane after lane. DataLoader workers own
contiguous runs of the rank's lanes, so a row group is decoded by one worker only (bar the
blocks cut by a lane boundary). Nothing here depends on ``W`` or the number of workers:
global batch ``k`` is the same set, in the same order, on any ``W`` and any number of workers
that divide the lanes (the elastic rule in the README).

Cost for one rank: one pass over the permuted blocks' sizes, in chunks (O(row groups) time,
O(chunk) memory, stopping once past the rank's lanes), keeping its blocks' offsets
(:class:`LanePlan`); then its samples are generated a chunk of global steps at a time
(:class:`RankStream`: the segments overlapping the chunk's columns, lane by lane), so memory
is O(lanes per rank x chunk) and the first batch costs the same at any epoch length; a resume
starts at its own columns. Nothing of size N is ever built; :func:`lane_samples` builds the
rank's lanes whole (the reference the stream is tested against, and what a mixture uses).

Progress through an epoch is one :class:`Progress` value: how many samples every lane has
consumed (plus, mid-step, how far into the rank's current step), so a resume on another
world size or worker count continues the same global batches.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from loaders.permute import Feistel, RunPermutation, hash32

_BLOCK_DOMAIN = 0x5EED_F10
_SHUFFLE_DOMAIN = 0x5EED_F11
#: Blocks handled per step of the scan over the permuted blocks (bounds its temporaries; a
#: chunk's arrays stay in cache).
CHUNK = 1 << 16


def group_samples(group_tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Samples per row group: whole windows of ``seq_len + 1`` tokens inside it."""
    return np.asarray(group_tokens, dtype=np.int64) // (seq_len + 1)


def lane_length(n_samples: int, lanes: int) -> int:
    """Samples per lane per epoch (``ceil(N / L)``)."""
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    return -(-n_samples // lanes)


def prefix_at(sizes: np.ndarray, index: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """``cumsum(sizes)[index] - sizes[index]`` (exclusive prefix sums) in O(chunk) memory."""
    index = np.asarray(index, dtype=np.int64)
    out = np.empty(len(index), dtype=np.int64)
    if not len(index):
        return out
    order = np.argsort(index, kind="stable")
    wanted = index[order]
    carry, k = 0, 0
    for lo in range(0, len(sizes), chunk):
        hi = min(lo + chunk, len(sizes))
        end = k + int(np.searchsorted(wanted[k:], hi))
        part = np.asarray(sizes[lo:hi], dtype=np.int64)
        if end > k:
            ex = np.cumsum(part) - part
            out[order[k:end]] = carry + ex[wanted[k:end] - lo]
            k = end
        carry += int(part.sum())
        if k == len(wanted):
            break
    return out


#: Blocks per window inside each lane, the one default (``loaders.settings`` and every loader
#: use it). A rank holds about lanes-per-rank x window_blocks row groups decoded (plus the
#: read-ahead): 2 keeps a default rank (8 lanes) at ~16 row groups, what the one-stream plan
#: held at 16, with every batch's samples from 8 different regions.
DEFAULT_WINDOW_BLOCKS = 2


#: The default ``run_blocks`` (``None``): the longest run, a power of two up to this, that
#: still leaves at least ``max(AUTO_MIN_RUNS, AUTO_RUNS_PER_LANE x lanes)`` runs to permute
#: (:func:`auto_run_blocks`). 64 row groups of the pipeline's 256 Ki tokens are 16 M tokens,
#: the tokens of one of litdata's 64 MB int32 chunks: one request per run is litdata's
#: request count per token (``benchmarks/request_scale.py``), and a lane dwells in one
#: region no longer than a litdata worker dwells in one chunk (``shuffle_quality.py``).
AUTO_MAX_RUN_BLOCKS = 64
AUTO_MIN_RUNS = 64
AUTO_RUNS_PER_LANE = 2


def auto_run_blocks(n_blocks: int, lanes: int) -> int:
    """``run_blocks`` for a plan that did not choose one: runs as long as the dataset allows.

    Why runs: a rank reads a contiguous 1/W of the permuted blocks, so with single blocks its
    requests to an object store are one row group each once the dataset has many more row
    groups than the read-ahead holds (``benchmarks/request_scale.py``: ~60x litdata's GETs
    per token at 1 T tokens); a run of ``k`` neighbours is one request (where the read-ahead
    budget holds a run per lane of the rank: ``loaders.coalesce.READAHEAD_BYTES``). Why
    bounded by the count of runs: fewer than ``lanes`` runs would put neighbouring row groups
    side by side in one global batch, and a few dozen runs would leave little to shuffle;
    with ``2 x lanes`` runs (and at least 64) every lane walks through two or more runs an
    epoch and a batch's lanes stand in different runs. Why at most 64: a lane dwells in one
    region of the input order for ``k`` row groups whatever the count (``shuffle_quality.py``'s
    lane span); 64 (16 M tokens at the default row groups) is as long as a litdata
    worker stays in one 64 MB chunk, while every global batch still draws each lane from
    another region (litdata's batch comes from one chunk). A small dataset (the demo's few
    dozen row groups, every test's) keeps 1: single blocks, the order of every version before
    runs existed."""
    if n_blocks < 0 or lanes < 1:
        raise ValueError(f"n_blocks must be >= 0 and lanes >= 1, got {n_blocks}, {lanes}")
    floor = max(AUTO_MIN_RUNS, AUTO_RUNS_PER_LANE * lanes)
    k = AUTO_MAX_RUN_BLOCKS
    while k > 1 and n_blocks // k < floor:
        k //= 2
    return k


@dataclass(frozen=True)
class PlanParams:
    """What fixes the order of an epoch (besides the sizes of the row groups)."""

    seed: int = 0
    shuffle: bool = True
    window_blocks: int = DEFAULT_WINDOW_BLOCKS
    #: consecutive blocks the permutation moves as one (:class:`loaders.permute.
    #: RunPermutation`): 1 = every block on its own (the order of every version before runs);
    #: ``k`` = a rank reads ``k`` neighbouring row groups with one request from an object
    #: store at any dataset size, its lanes staying ``k`` blocks in one region. ``None`` (the
    #: default): :func:`auto_run_blocks` of the row groups and lanes (:meth:`resolved`)
    run_blocks: int | None = None

    def resolved(self, n_blocks: int, lanes: int) -> PlanParams:
        """These parameters with ``run_blocks`` fixed for ``n_blocks`` row groups and
        ``lanes`` lanes: what the order is computed from, and what a state records."""
        if self.run_blocks is not None:
            return self
        return replace(self, run_blocks=auto_run_blocks(n_blocks, lanes))


def run_length(params: PlanParams, n_blocks: int) -> int:
    """Blocks per run of the epoch's shuffled order (``params`` resolved): ``run_blocks``,
    except that a run of more blocks than there are is one run of them all (the same order as
    a run of exactly ``n_blocks``, without a padded domain to scan: a huge ``run_blocks`` on
    purpose or by mistake would otherwise cost O(run_blocks) per plan); 1 without shuffling,
    where there is no permutation to make runs of."""
    if params.run_blocks is None:
        raise ValueError("run_blocks is None (auto): resolve the parameters against the "
                         "row groups and lanes first (PlanParams.resolved)")
    return min(params.run_blocks, max(1, n_blocks)) if params.shuffle else 1


def block_permutation(n_blocks: int, params: PlanParams,
                      epoch: int) -> Feistel | RunPermutation | None:
    """The epoch's permutation of blocks (``None``: the identity, when not shuffling). With
    ``run_blocks > 1`` its domain is padded to whole runs (``perm.n >= n_blocks``; images
    ``>= n_blocks`` are empty slots), never beyond one run of all the blocks."""
    run = run_length(params, n_blocks)  # checks run_blocks is resolved
    if not params.shuffle:
        return None
    key = (_BLOCK_DOMAIN, params.seed, epoch)
    if run > 1:
        return RunPermutation(n_blocks, run, key)
    return Feistel(n_blocks, key)


def _padded_sizes(sizes: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``sizes[g]``, 0 for the empty slots ``g >= len(sizes)`` of a run-padded permutation."""
    out = np.zeros(len(g), dtype=sizes.dtype)
    real = g < len(sizes)
    out[real] = sizes[g[real]]
    return out


def _scan(sizes: np.ndarray, perm: Feistel | RunPermutation | None, lo: int, hi: int,
          window: int,
          chunk: int = CHUNK, total: int | None = None,
          backward: bool | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The permuted blocks overlapping positions ``[lo, hi)``, and the window starts inside.

    Returns (group of each block, its first position, its size, the positions where a window
    of ``window`` blocks starts, within ``[lo, hi)``), in permuted order. One pass over the
    permuted sizes, in chunks, from the nearer end of the epoch (``total``: the sum of
    ``sizes``): forward from position 0 until ``hi`` is passed, or backward from ``total``
    until ``lo`` is, so no rank scans more than half the blocks (and its own). A chunk wholly
    outside ``[lo, hi)`` is only summed. ``backward`` forces a direction (tests).
    """
    n = perm.n if perm is not None else len(sizes)  # run-padded: empty slots count as blocks
    sizes_at = _padded_sizes if n > len(sizes) else operator.getitem
    if total is None:
        total = int(np.asarray(sizes).sum(dtype=np.int64))
    if backward is None:
        backward = lo > total - hi
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    empty = np.zeros(0, dtype=np.int64)

    def take(idx: np.ndarray, g: np.ndarray, s: np.ndarray, before: int) -> None:
        s = s.astype(np.int64)
        ends = before + np.cumsum(s)
        first = ends - s
        keep = (ends > lo) & (first < hi) & (s > 0)
        at_cut = (idx % window == 0) & (first >= lo) & (first < hi)  # empty blocks too
        pieces.append((g[keep], first[keep], s[keep], first[at_cut]))

    if not backward:
        carry = 0
        for i0 in range(0, n, chunk):
            idx = np.arange(i0, min(i0 + chunk, n), dtype=np.int64)
            g = perm(idx) if perm is not None else idx
            s = sizes_at(sizes, g)
            part = int(s.sum(dtype=np.int64))
            if carry + part >= lo:  # else every block of the chunk ends before the range
                take(idx, g, s, carry)
            carry += part
            if carry >= hi:
                break
    else:
        carry = total  # where the chunk ends
        for i1 in range(n, 0, -chunk):
            idx = np.arange(max(0, i1 - chunk), i1, dtype=np.int64)
            g = perm(idx) if perm is not None else idx
            s = sizes_at(sizes, g)
            before = carry - int(s.sum(dtype=np.int64))
            if before < hi:  # else every block of the chunk starts past the range
                take(idx, g, s, before)
            carry = before
            if carry < lo:
                break
        pieces.reverse()
    groups = [p[0] for p in pieces if len(p[0])]
    if not groups:
        return empty, empty, empty, empty
    return (np.concatenate(groups), np.concatenate([p[1] for p in pieces]),
            np.concatenate([p[2] for p in pieces]),
            np.concatenate([empty, *(p[3] for p in pieces)]))


def lane_bounds(n_samples: int, lanes: int, lane_lo: int, lane_hi: int) -> np.ndarray:
    """First position of lanes ``lane_lo .. lane_hi`` (``j N // L``): lengths within one."""
    return np.arange(lane_lo, lane_hi + 1, dtype=np.int64) * n_samples // lanes


def lane_samples(sizes: np.ndarray, params: PlanParams, epoch: int, lanes: int,
                 lane_lo: int, lane_hi: int) -> np.ndarray:
    """Sample ids of lanes ``lane_lo .. lane_hi - 1`` for one epoch: ``[lanes, m]`` int64.

    Row ``j - lane_lo`` is lane ``j``'s sequence (see the module docstring). Pure: depends
    only on ``sizes`` (samples per row group), ``params``, ``epoch``, ``lanes`` and the lane
    range, never on which rank or worker asks.
    """
    sizes = np.asarray(sizes)
    if not 0 <= lane_lo <= lane_hi <= lanes:
        raise ValueError(f"lanes [{lane_lo}, {lane_hi}) outside [0, {lanes})")
    params = params.resolved(len(sizes), lanes)
    n = int(sizes.sum(dtype=np.int64))
    m = lane_length(n, lanes)
    out = np.empty((lane_hi - lane_lo, m), dtype=np.int64)
    if n == 0 or lane_lo == lane_hi:
        return out
    bounds = lane_bounds(n, lanes, lane_lo, lane_hi)
    lo, hi = int(bounds[0]), int(bounds[-1])
    if lo < hi:
        perm = block_permutation(len(sizes), params, epoch)
        groups, starts, _lengths, cuts = _scan(sizes, perm, lo, hi, max(1, params.window_blocks),
                                               total=n)
        base = prefix_at(sizes, groups)  # first sample id of each block in the range
        key = (_SHUFFLE_DOMAIN, params.seed, epoch)
    # One lane at a time: temporaries are O(lane), only the result is O(lanes x m).
    for row, j in enumerate(range(lane_lo, lane_hi)):
        a, b = int(bounds[row]), int(bounds[row + 1])
        real = b - a
        if real == 0:  # a lane with no sample at all (only when N < L): the grid
            out[row] = (j * m + np.arange(m, dtype=np.int64)) % n
            continue
        pos = np.arange(a, b, dtype=np.int64)
        if perm is not None:
            # Segments: the windows of blocks cut by the lane; shuffled inside each.
            inner = cuts[(cuts > a) & (cuts < b)]
            seg = np.searchsorted(inner, pos, side="right").astype(np.uint64)
            pos = a + np.argsort((seg << np.uint64(32)) | hash32(pos, key), kind="stable")
            del seg
            # A lane that starts inside a block consumes its first segment last: the block
            # cut by the boundary is then used by both lanes near the end of the epoch, and
            # a reader holds it for about one window, not for the whole epoch.
            first = int(np.searchsorted(starts, a, side="right")) - 1
            if starts[first] != a and len(inner):
                pos = np.roll(pos, a - int(inner[0]))
        block = np.searchsorted(starts, pos, side="right") - 1
        out[row, :real] = base[block] + (pos - starts[block])
        if real < m:  # completed by repeating the lane's own last sample(s)
            out[row, real:] = out[row, real - 1 - np.arange(m - real) % real]
    return out


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` (sorted, each once) without its check for masked arrays, which
    imports ``numpy.ma`` (~10 ms of a process's first batch)."""
    out = np.sort(values)
    return out[np.concatenate([[True], out[1:] != out[:-1]])] if len(out) else out


class LanePlan:
    """Random access to lanes ``lane_lo .. lane_hi - 1`` of one epoch, a range of columns at
    a time: ``columns(c0, c1)`` is ``lane_samples(...)[:, c0:c1]``, bit for bit, computed from
    the segments that overlap the columns only.

    Built once per (epoch, lane range): the same chunked scan as :func:`lane_samples` (O(row
    groups) time, O(chunk) temporaries), keeping the blocks of the lanes' positions (three
    int64 per block) and the window starts inside; nothing per sample. A call then costs
    O(lanes x (c1 - c0 + one segment)), whatever ``c0`` is: a resume jumps straight to its
    columns.
    """

    def __init__(self, sizes: np.ndarray, params: PlanParams, epoch: int, lanes: int,
                 lane_lo: int, lane_hi: int) -> None:
        sizes = np.asarray(sizes)
        if not 0 <= lane_lo <= lane_hi <= lanes:
            raise ValueError(f"lanes [{lane_lo}, {lane_hi}) outside [0, {lanes})")
        params = params.resolved(len(sizes), lanes)
        self.lanes, self.lane_lo, self.lane_hi = lanes, lane_lo, lane_hi
        self.n = n = int(sizes.sum(dtype=np.int64))
        self.m = lane_length(n, lanes)
        self.bounds = lane_bounds(n, lanes, lane_lo, lane_hi)
        self.shuffle = params.shuffle
        self.key = (_SHUFFLE_DOMAIN, params.seed, epoch)
        empty = np.zeros(0, dtype=np.int64)
        self.starts, self.base, self.cuts = empty, empty, empty
        lo, hi = int(self.bounds[0]), int(self.bounds[-1])
        if n and lo < hi:
            perm = block_permutation(len(sizes), params, epoch)
            groups, self.starts, _lengths, self.cuts = _scan(
                sizes, perm, lo, hi, max(1, params.window_blocks), total=n)
            self.base = prefix_at(sizes, groups)
        self._edges: dict[int, tuple[np.ndarray, int]] = {}

    def _segments(self, j: int) -> tuple[np.ndarray, int]:
        """Lane ``j``'s segment edges in its own consumption order (``0 .. real``), and the
        position where that order starts (the lane is ``[r0, b)`` then ``[a, r0)``)."""
        got = self._edges.get(j)
        if got is None:
            row = j - self.lane_lo
            a, b = int(self.bounds[row]), int(self.bounds[row + 1])
            cuts = self.cuts
            inner = cuts[int(np.searchsorted(cuts, a, side="right")):
                         int(np.searchsorted(cuts, b, side="left"))]
            first = int(np.searchsorted(self.starts, a, side="right")) - 1
            r0 = int(inner[0]) if self.starts[first] != a and len(inner) else a
            # u = offset in consumption order; positions [r0, b) come first, then [a, r0).
            # The cuts, plus (rolled) the wrap at b - r0 where segment [a, r0) begins.
            edges = _distinct(np.concatenate([[0, b - a, b - r0], inner - r0]).astype(np.int64))
            got = self._edges[j] = (edges, r0)
        return got

    def _real(self, j: int, d0: int, d1: int) -> np.ndarray:
        """Sample ids of lane ``j``'s own (unpadded) columns ``[d0, d1)``."""
        row = j - self.lane_lo
        a, b = int(self.bounds[row]), int(self.bounds[row + 1])
        if not self.shuffle:
            pos = np.arange(a + d0, a + d1, dtype=np.int64)
        else:
            edges, r0 = self._segments(j)
            u_lo = int(edges[int(np.searchsorted(edges, d0, side="right")) - 1])
            u_hi = int(edges[int(np.searchsorted(edges, d1, side="left"))])
            u = np.arange(u_lo, u_hi, dtype=np.int64)
            pos = np.where(u < b - r0, r0 + u, a + u - (b - r0))
            seg = np.searchsorted(edges, u, side="right").astype(np.uint64)
            order = np.argsort((seg << np.uint64(32)) | hash32(pos, self.key), kind="stable")
            pos = pos[order[d0 - u_lo:d1 - u_lo]]
        block = np.searchsorted(self.starts, pos, side="right") - 1
        return self.base[block] + (pos - self.starts[block])

    def columns(self, c0: int, c1: int) -> np.ndarray:
        """Columns ``[c0, c1)`` of every lane of the range: ``[lanes, c1 - c0]`` int64."""
        c0, c1 = max(0, c0), min(max(c0, c1), self.m)
        out = np.empty((self.lane_hi - self.lane_lo, max(0, c1 - c0)), dtype=np.int64)
        if c1 <= c0 or self.n == 0:
            return out
        for row, j in enumerate(range(self.lane_lo, self.lane_hi)):
            real = int(self.bounds[row + 1] - self.bounds[row])
            if real == 0:  # a lane with no sample at all (only when N < L): the grid
                out[row] = (j * self.m + np.arange(c0, c1, dtype=np.int64)) % self.n
                continue
            d0, d1 = min(c0, real), min(c1, real)
            if d0 < d1:
                out[row, :d1 - d0] = self._real(j, d0, d1)
            if c1 > real:  # padding: the lane's own last samples, repeated backwards
                k = np.arange(max(c0, real) - real, c1 - real, dtype=np.int64)
                src = real - 1 - k % real
                low = int(src.min())
                tail = self._real(j, low, real)
                out[row, max(c0, real) - c0:] = tail[src - low]
        return out


# -- batches: lanes -> steps -> this rank's batches ----------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How a job consumes the plan: what may change between runs of the same plan.

    ``lanes`` and ``per_lane`` (samples per lane per global batch; ``B = per_lane * lanes``)
    fix the global batches; ``world_size`` must divide ``lanes``; ``batch_size`` (per rank,
    per iteration) must divide the rank's share of a global batch, ``per_lane * lanes /
    world_size`` (several batches per global batch: gradient accumulation).
    """

    lanes: int
    per_lane: int
    world_size: int = 1
    rank: int = 0
    batch_size: int = 0  # 0: the rank's whole share of a global batch

    def __post_init__(self) -> None:
        if self.lanes < 1 or self.per_lane < 1:
            raise ValueError(f"lanes and per_lane must be >= 1, got {self.lanes}, "
                             f"{self.per_lane}")
        if self.world_size < 1 or self.lanes % self.world_size:
            raise ValueError(f"world size {self.world_size} does not divide the plan's "
                             f"{self.lanes} lanes (the global batch is {self.global_batch}); "
                             "use a world size that divides it")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if self.batch_size < 0 or (self.batch_size and self.step % self.batch_size):
            raise ValueError(f"batch size {self.batch_size} does not divide this rank's "
                             f"share of a global batch ({self.step} samples)")

    @property
    def global_batch(self) -> int:
        return self.lanes * self.per_lane

    @property
    def lanes_per_rank(self) -> int:
        return self.lanes // self.world_size

    @property
    def step(self) -> int:
        """Samples of one global batch that this rank takes."""
        return self.lanes_per_rank * self.per_lane

    @property
    def batch(self) -> int:
        return self.batch_size or self.step

    def rank_lanes(self) -> tuple[int, int]:
        lo = self.rank * self.lanes_per_rank
        return lo, lo + self.lanes_per_rank


@dataclass(frozen=True)
class Progress:
    """Where an epoch stands: one immutable value, the same on every rank.

    ``lane_pos``: samples every lane has consumed (whole global batches). ``into_step``:
    samples of this rank's share of the next global batch already consumed (mid-step only,
    with gradient accumulation); it means something only for the ``(world_size, batch_size)``
    in ``mid_step_layout``, so a resume on another layout must start at a step boundary.
    """

    epoch: int = 0
    lane_pos: int = 0
    into_step: int = 0
    mid_step_layout: tuple[int, int] | None = None

    def next_epoch(self) -> Progress:
        return Progress(self.epoch + 1)

    def at_epoch(self, epoch: int) -> Progress:
        return self if epoch == self.epoch else Progress(epoch)


def advance(progress: Progress, layout: Layout, lane_len: int, samples: int) -> Progress:
    """The progress after this rank consumed ``samples`` more samples of its sequence."""
    into = progress.into_step + samples
    pos, c, lanes = progress.lane_pos, layout.per_lane, layout.lanes_per_rank
    k = min(into // (c * lanes), max(0, lane_len - pos) // c)  # whole global batches
    pos, into = pos + k * c, into - k * c * lanes
    rest = lane_len - pos  # the epoch's last, shorter global batch
    if 0 < rest < c and into >= rest * lanes:
        pos, into = lane_len, into - rest * lanes
    if pos >= lane_len:
        into = 0
    mid = (layout.world_size, layout.batch) if into else None
    # Built directly, not with dataclasses.replace: this runs once per batch (~2 us saved).
    return Progress(progress.epoch, pos, into, mid)


def arrange(lane_block: np.ndarray, per_lane: int, start: int = 0) -> np.ndarray:
    """Lanes ``[l, m]`` -> consumption order from column ``start``: step after step, and
    within a step lane after lane (``per_lane`` consecutive samples of each)."""
    lanes, m = lane_block.shape
    cols = m - start
    if cols <= 0 or lanes == 0:
        return np.zeros(0, dtype=lane_block.dtype)
    full = cols // per_lane
    out = np.empty(lanes * cols, dtype=lane_block.dtype)
    split = full * per_lane * lanes
    out[:split].reshape(full, lanes, per_lane)[:] = lane_block[
        :, start:start + full * per_lane].reshape(lanes, full, per_lane).transpose(1, 0, 2)
    out[split:] = lane_block[:, start + full * per_lane:].reshape(-1)
    return out


def sequence(lane_block: np.ndarray, layout: Layout, progress: Progress) -> np.ndarray:
    """This rank's samples still to come in the epoch, in order (batches: every
    ``layout.batch`` consecutive ones)."""
    check_resume(layout, progress)
    return arrange(lane_block, layout.per_lane, progress.lane_pos)[progress.into_step:]


#: Samples of the rank's sequence generated per chunk of a :class:`RankStream` (about; at
#: least one global batch's share). 64 Ki int64: 0.5 MB, a few ms.
STREAM_CHUNK = 1 << 16


def check_resume(layout: Layout, progress: Progress) -> None:
    if progress.into_step and progress.mid_step_layout != (layout.world_size, layout.batch):
        raise ValueError(
            f"progress is {progress.into_step} samples into a global batch under (world size, "
            f"batch size) {progress.mid_step_layout}; resume on another layout at a global "
            "batch boundary")


class LaneColumns(Protocol):
    """Lanes of one epoch a range of columns at a time: ``columns(c0, c1)`` is
    ``lane_samples(...)[:, c0:c1]`` (:class:`LanePlan` computes it, :class:`WholeLanes`
    slices lanes already drawn)."""

    def columns(self, c0: int, c1: int) -> np.ndarray: ...


class WholeLanes:
    """:class:`LaneColumns` of lanes drawn whole (``[lanes, m]``): for sources whose plan
    cannot be cut by column, such as a mixture."""

    def __init__(self, lanes: np.ndarray) -> None:
        self.lanes = lanes

    def columns(self, c0: int, c1: int) -> np.ndarray:
        return self.lanes[:, c0:c1]


class RankStream:
    """This rank's samples still to come in the epoch, generated a chunk of global steps at
    a time: concatenated, :meth:`chunks` is exactly :func:`sequence`'s result.

    ``columns(c0, c1)`` gives columns ``[c0, c1)`` of the rank's lanes (``[lanes, c1 - c0]``,
    e.g. :meth:`LanePlan.columns`); each chunk asks for whole global steps from the progress'
    ``lane_pos`` on, so a resume starts at its own columns and memory is one chunk
    (``chunk_samples``, at least one step's share) whatever the epoch's length.
    """

    def __init__(self, columns: Callable[[int, int], np.ndarray], lane_len: int,
                 layout: Layout, progress: Progress, chunk_samples: int = STREAM_CHUNK
                 ) -> None:
        check_resume(layout, progress)
        self.columns, self.lane_len = columns, lane_len
        self.layout, self.progress = layout, progress
        self.steps_per_chunk = max(1, chunk_samples // layout.step)

    def __len__(self) -> int:
        left = max(0, self.lane_len - self.progress.lane_pos) * self.layout.lanes_per_rank
        return max(0, left - self.progress.into_step)

    def chunks(self) -> Iterator[np.ndarray]:
        """The sequence in consecutive pieces of whole global steps (the first one less the
        progress' ``into_step``); no piece is empty."""
        per_lane = self.layout.per_lane
        width = self.steps_per_chunk * per_lane
        skip = self.progress.into_step
        for c0 in range(self.progress.lane_pos, self.lane_len, width):
            part = arrange(self.columns(c0, min(c0 + width, self.lane_len)), per_lane)
            if skip:
                drop = min(skip, len(part))
                part, skip = part[drop:], skip - drop
            if len(part):
                yield part

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.chunks()

    def batches(self) -> Iterator[np.ndarray]:
        """The rank's batches (``layout.batch`` samples, the last one maybe shorter), as
        :func:`batches_of` cuts :func:`sequence`'s result."""
        return rebatch(self.chunks(), self.layout.batch)

    def materialise(self) -> np.ndarray:
        parts = list(self.chunks())
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def rebatch(chunks: Iterator[np.ndarray], batch: int) -> Iterator[np.ndarray]:
    """Consecutive pieces -> consecutive runs of ``batch`` (the last one maybe shorter)."""
    held: list[np.ndarray] = []
    count = 0
    for part in chunks:
        lo = 0
        if count:
            take = min(batch - count, len(part))
            held.append(part[:take])
            count, lo = count + take, take
            if count < batch:
                continue
            yield np.concatenate(held)
            held, count = [], 0
        full = lo + (len(part) - lo) // batch * batch
        for k in range(lo, full, batch):
            yield part[k:k + batch]
        if full < len(part):
            held, count = [part[full:]], len(part) - full
    if count:
        yield np.concatenate(held)


def batch_pieces(chunks: Iterable[np.ndarray], batch: int, at_least: int
                 ) -> Iterator[tuple[np.ndarray, list[int]]]:
    """Consecutive pieces -> ``(samples, batch sizes)`` pieces of whole batches: each piece
    the fewest whole batches of :func:`rebatch`'s cut holding ``at_least`` samples (the last
    piece the rest; only the stream's last batch may be shorter).

    What grouping :func:`rebatch`'s batches gives, without them: the stream is cut once per
    piece, not sliced into a batch at a time (~3,000 slices per 50 M tokens) and joined again
    (``build_dataloader``'s loader did that on the way to its first batch, and per piece)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    size = max(1, -(-at_least // batch)) * batch  # a piece's samples: whole batches
    held: list[np.ndarray] = []
    count = 0
    for part in chunks:
        if not len(part):
            continue
        held.append(part)
        count += len(part)
        if count < size:
            continue
        joined = np.concatenate(held) if len(held) > 1 else held[0]
        cut = count // size * size
        for lo in range(0, cut, size):
            yield joined[lo:lo + size], [batch] * (size // batch)
        held = [joined[cut:]] if cut < count else []
        count -= cut
    if count:
        rest = np.concatenate(held) if len(held) > 1 else held[0]
        yield rest, [batch] * (count // batch) + ([count % batch] if count % batch else [])


def rank_batches(lane_len: int, layout: Layout, progress: Progress) -> int:
    """Batches still to come on this rank (the same on every rank), lanes of ``lane_len``."""
    m = lane_len
    left = max(0, m - progress.lane_pos) * layout.lanes_per_rank - progress.into_step
    return -(-max(0, left) // layout.batch)


def worker_lanes(lanes_per_rank: int, num_workers: int) -> list[tuple[int, int]]:
    """The rank's lanes (as offsets) owned by each worker: contiguous, sizes within one."""
    if num_workers < 1 or num_workers > lanes_per_rank:
        raise ValueError(f"{num_workers} workers for {lanes_per_rank} lanes per rank: "
                         "each worker owns at least one lane")
    edges = [lanes_per_rank * w // num_workers for w in range(num_workers + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def worker_parts(lanes_per_rank: int, m: int, layout: Layout, progress: Progress,
                 worker: int, num_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Which of the rank's sequence positions a worker produces, and its part of each batch.

    Returns (positions into :func:`sequence`'s result that this worker owns, in order;
    number of them in each batch). Concatenating the workers' parts of a batch in worker
    order gives the batch in order, because within a step samples go lane after lane and
    workers own contiguous lanes.
    """
    lo, hi = worker_lanes(lanes_per_rank, num_workers)[worker]
    lane_of = np.broadcast_to(np.arange(lanes_per_rank, dtype=np.int64)[:, None],
                              (lanes_per_rank, m))
    lanes = sequence(lane_of, layout, progress)
    mine = np.flatnonzero((lanes >= lo) & (lanes < hi))
    n_batches = -(-len(lanes) // layout.batch)
    counts = np.bincount(mine // layout.batch, minlength=n_batches)
    return mine, counts


def batches_of(samples: np.ndarray, batch: int) -> Iterator[np.ndarray]:
    for lo in range(0, len(samples), batch):
        yield samples[lo:lo + batch]
