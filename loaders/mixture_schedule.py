"""Mixture schedules: component weights that change with the training step (pure: no I/O).

A **schedule** is a list of points ``(step, weights)``: the first at step 0, steps strictly
increasing, every weight finite and >= 0, every point's weights summing to more than 0 (a
component may be off, weight 0, for part of training; never all of them). Each point's weights
are normalised to *shares*; between two points the shares are held (``ramp="step"``) or move
linearly (``ramp="linear"``); after the last point they stay. Step ``k`` is the ``k``-th
global batch counted from 0 (the batch of the trainer's optimizer step ``k + 1``) and has the
shares at ``k``. A schedule of one point is a fixed mixture, which
:class:`loaders.mixture.MixtureSource` draws as it always has (one apportionment per epoch), so
fixed mixtures keep their batches.

**Counts per step.** A step is one global batch of ``B`` samples; its target for component
``i`` is ``B x share_i(k)``. ``T_i(K)``, the targets of steps ``0 .. K-1`` summed, is in closed
form (a sum per segment between points, arithmetic series under a linear ramp). ``A_i(K)``, the
samples of component ``i`` in the first ``K`` steps, is ``T(K)`` apportioned by largest
remainder to the total ``K B`` (``LRR(T)``), within one sample of the target at every step
boundary, whatever ``B``. Rounding each step on its own would not do: 10 % of a batch of 8
rounds to one sample in eight, 12.5 %, at every step. Step ``k`` takes ``A(k+1) - A(k)``,
except where that would take a sample back (largest remainder of a growing total is not
monotone once there are three components or more: a component whose share is below ``1/B`` can
lose its rounded-up sample to another's larger remainder) or give one to a component whose
share at step ``k`` is 0 (off means off, even if a fraction of a sample is still owed to it).
Such a step instead gives its ``B`` samples to the components that are on, the most owed
first (:func:`catch_up`), and the first later step where ``LRR(T)`` is consistent again puts
the counts back on it. So ``A`` stays within two samples of ``T`` (property-tested; 1.25 the
worst seen with up to 12 components) and any run of steps has its scheduled share to within
four samples per component. The common case is vectorised over steps; only the exceptions
are walked one step at a time. Every rank computes the same integers.

**Lanes** (:mod:`loaders.plan`). Step ``k`` is ``c = B / L`` columns of every one of the ``L``
lanes. Its ``B`` slots, component 0's first, then component 1's, ..., are dealt round the lanes
from a start lane that moves with ``k`` (:func:`deal_start`: ``k G mod L``, ``G`` the integer
nearest ``0.618 L`` coprime to ``L``, plus a keyed shift drawn once per ``L`` steps), so every
lane gets exactly ``c`` slots, and over ``L`` consecutive steps with the same counts the starts
visit every lane once: every lane gets each component equally often, no lane runs ahead in a
component's stream. A fixed start would give the lane after component 0's slots the small
component at every step; a plain rotation lines up with counts that follow a pattern (with 2
lanes, a count alternating 1, 2 meets starts 0, 1, 0, 1 and one lane gets the 2 every time),
which the shift turns into a random walk (the spread between lanes then grows like the square
root of the steps, not linearly). Within a lane a step's ``c`` slots are put in an order keyed
by (seed, step, lane). Lane ``j``'s position in component ``i``'s own stream (lane ``j`` of the
component's plan, continuing into its next epochs) is the number of its earlier slots of ``i``:
a prefix sum over steps, which :class:`LaneDeal` carries from one call to the next (a training
run asks for epoch after epoch), so a rank computes only its own lanes, and a call costs time
linear in the steps since the last one. Nothing depends on the world size or the worker count,
only on the lanes.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from loaders.permute import hash32

Ramp = Literal["step", "linear"]
RAMPS: tuple[str, ...] = ("step", "linear")
_SLOT_DOMAIN = 0x313D
_ROTATE_DOMAIN = 0x313E
#: Steps computed per pass of the vectorised count and deal (bounds the temporaries).
CHUNK_STEPS = 1 << 15
#: The largest step a point may name (exact in a float64 and in JSON everywhere).
MAX_STEP = 1 << 53
_GOLDEN = (math.sqrt(5) - 1) / 2


def apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """``total`` split by ``weights`` (>= 0, sum > 0) by largest remainder: counts that add up
    to ``total``, each within one of its exact share; ties go to the lower index."""
    w = np.asarray(weights, dtype=np.float64)
    exact = w / w.sum() * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


def catch_up(owed: np.ndarray, total: int) -> np.ndarray:
    """``total`` samples given to the components most owed (``owed``: target minus count so
    far, some maybe negative; they sum to about ``total``): the level ``lam`` at which the
    shortfalls above it, ``max(owed - lam, 0)``, add up to ``total`` is found, and those
    are apportioned (:func:`apportion`). What largest-deficit-first gives one sample at a
    time, at once: nobody ahead is given more, the furthest behind catch up first."""
    d = np.asarray(owed, dtype=np.float64)
    top = np.sort(d)[::-1]
    lam = 0.0
    for m in range(1, len(top) + 1):  # the level over the m most owed
        lam = (float(top[:m].sum()) - total) / m
        if m == len(top) or top[m] <= lam:
            break
    w = np.maximum(d - lam, 0.0)
    if not w.sum() > 0:  # every shortfall equal: evenly
        w = np.ones_like(d)
    return apportion(w, total)


def apportion_rows(targets: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Each row of ``targets`` (>= 0, summing to about ``totals``) rounded by largest remainder
    to integers summing to exactly its total (ties to the lower index): ``[rows, n]`` int64."""
    floor = np.floor(targets)
    counts = floor.astype(np.int64)
    short = np.asarray(totals, dtype=np.int64) - counts.sum(axis=1)
    order = np.argsort(-(targets - floor), axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(targets.shape[1]), order.shape),
                      axis=1)
    return counts + (rank < short[:, None])


@dataclass(frozen=True)
class Schedule:
    """Component weights at given steps (see the module docstring); ``ValueError`` naming the
    point and what is wrong with it."""

    steps: tuple[int, ...]
    weights: tuple[tuple[float, ...], ...]
    ramp: Ramp = "linear"

    def __post_init__(self) -> None:
        if not self.steps or len(self.steps) != len(self.weights):
            raise ValueError("a schedule needs one or more points, each a step and weights")
        if self.ramp not in RAMPS:
            raise ValueError(f"ramp is {self.ramp!r}, not one of {', '.join(RAMPS)}")
        n = len(self.weights[0])
        for p, (step, w) in enumerate(zip(self.steps, self.weights, strict=True)):
            if (not isinstance(step, int) or isinstance(step, bool)
                    or not 0 <= step <= MAX_STEP):
                raise ValueError(f"point {p}: step {step!r} is not an integer in "
                                 f"[0, {MAX_STEP}]")
            if p == 0 and step != 0:
                raise ValueError(f"point 0 is at step {step}: the first point must be at "
                                 "step 0")
            if p and step <= self.steps[p - 1]:
                raise ValueError(f"point {p}: step {step} does not come after step "
                                 f"{self.steps[p - 1]} (steps must increase)")
            if len(w) != n or not n:
                raise ValueError(f"point {p}: {len(w)} weights, point 0 has {n}")
            bad = [x for x in w if not math.isfinite(x) or x < 0]
            if bad:
                raise ValueError(f"point {p}: weight {bad[0]!r} is not finite and >= 0")
            if not sum(w) > 0:
                raise ValueError(f"point {p}: every weight is 0 (at least one component must "
                                 "have a positive weight)")
            if not math.isfinite(sum(w)):
                raise ValueError(f"point {p}: the weights' sum overflows (scale them down)")

    @classmethod
    def of(cls, points: Sequence[tuple[int, Sequence[float]]], ramp: Ramp = "linear"
           ) -> Schedule:
        """A schedule from ``[(step, [w_0, w_1, ...]), ...]``."""
        steps = tuple(int(s) if isinstance(s, np.integer) else s for s, _w in points)
        return cls(steps, tuple(tuple(float(x) for x in w) for _s, w in points), ramp)

    @classmethod
    def fixed(cls, weights: Sequence[float]) -> Schedule:
        return cls((0,), (tuple(float(w) for w in weights),), "step")

    @property
    def components(self) -> int:
        return len(self.weights[0])

    @property
    def constant(self) -> bool:
        """One point: a fixed mixture."""
        return len(self.steps) == 1

    @property
    def shares(self) -> np.ndarray:
        """Each point's weights normalised: ``[points, components]``."""
        w = np.asarray(self.weights, dtype=np.float64)
        return w / w.sum(axis=1, keepdims=True)

    def identity(self) -> dict[str, Any]:
        """What fixes the order (saved in loader states, compared at a resume)."""
        return {"ramp": self.ramp, "steps": list(self.steps),
                "weights": [list(w) for w in self.weights]}

    def shares_at(self, k: np.ndarray | Sequence[int]) -> np.ndarray:
        """The shares of steps ``k``: ``[len(k), components]``."""
        k = np.asarray(k, dtype=np.int64)
        p = self.shares
        j = np.searchsorted(np.asarray(self.steps), k, side="right") - 1
        if self.ramp == "step" or len(self.steps) == 1:
            return p[j]
        last = len(self.steps) - 1
        nxt = np.minimum(j + 1, last)
        span = np.asarray(self.steps + (self.steps[-1] + 1,), dtype=np.int64)
        length = span[j + 1] - span[j]
        frac = np.where(j < last, (k - span[j]) / length, 0.0)[:, None]
        return p[j] + (p[nxt] - p[j]) * frac

    def targets(self, K: np.ndarray | Sequence[int], step_samples: int) -> np.ndarray:
        """``T(K)``: the samples each component is scheduled in steps ``0 .. K-1``, summed
        (floats, ``[len(K), components]``), in closed form per segment between points."""
        K = np.asarray(K, dtype=np.int64)
        p = self.shares
        steps = np.asarray(self.steps, dtype=np.int64)
        linear = self.ramp == "linear"

        def segment_sum(j: np.ndarray, d: np.ndarray) -> np.ndarray:
            """Shares of steps ``steps[j] .. steps[j] + d - 1`` summed (``d`` within the
            segment)."""
            d = d.astype(np.float64)[:, None]
            out = d * p[j]
            if linear:
                ramping = j < len(steps) - 1
                nxt = np.minimum(j + 1, len(steps) - 1)
                length = np.where(ramping, steps[nxt] - steps[j], 1).astype(np.float64)
                slope = (p[nxt] - p[j]) / length[:, None]
                out = out + np.where(ramping[:, None], slope * (d * (d - 1) / 2), 0.0)
            return out

        # Each point's base: the whole segments before it.
        base = np.zeros((len(steps), p.shape[1]))
        if len(steps) > 1:
            whole = segment_sum(np.arange(len(steps) - 1), np.diff(steps))
            base[1:] = np.cumsum(whole, axis=0)
        j = np.searchsorted(steps, K, side="right") - 1
        j = np.maximum(j, 0)
        t = base[j] + segment_sum(j, K - steps[j])
        return np.maximum(t, 0.0) * step_samples


def cumulative_counts(schedule: Schedule, step_samples: int, k0: int, k1: int,
                      start: np.ndarray) -> np.ndarray:
    """``A(k0) .. A(k1)`` (``[k1 - k0 + 1, components]`` int64) given ``A(k0) = start``: the
    samples of each component in the first ``K`` steps (module docstring). A step gives
    nothing to a component whose share at that step is 0: off means off, even where the
    component is still owed a fraction of a sample from before."""
    K = np.arange(k0, k1 + 1, dtype=np.int64)
    T = schedule.targets(K, step_samples)
    lrr = apportion_rows(T, K * step_samples)
    on = schedule.shares_at(K[:-1]) > 0  # [steps, components]: may step k give to i
    out = lrr.copy()
    out[0] = start
    # Transitions t -> t + 1 along which LRR(T) goes backwards for some component, or gives
    # to one that is off.
    step = np.diff(lrr, axis=0)
    wrong = np.flatnonzero(((step < 0) | ((step > 0) & ~on)).any(axis=1))
    t = 0
    while t < len(K) - 1:
        if np.array_equal(out[t], lrr[t]):  # on LRR(T): it holds until it goes wrong
            i = int(np.searchsorted(wrong, t))
            if i == len(wrong):
                break
            t = int(wrong[i])
        here, cand = out[t], lrr[t + 1]
        if (cand >= here).all() and (cand[~on[t]] == here[~on[t]]).all():
            out[t + 1] = cand
        else:
            give = np.zeros_like(here)
            give[on[t]] = catch_up((T[t + 1] - here)[on[t]], step_samples)
            out[t + 1] = here + give
        t += 1
    return out


def rotation_multiplier(lanes: int) -> int:
    """``G``: the integer nearest ``0.618 lanes`` that is coprime to ``lanes`` (0 for one
    lane)."""
    if lanes <= 1:
        return 0
    g0 = round(_GOLDEN * lanes)
    for d in range(lanes):
        for g in (g0 - d, g0 + d):
            if 1 <= g < lanes and math.gcd(g, lanes) == 1:
                return g
    return 1  # unreachable: 1 is coprime to every lanes


def deal_start(k: np.ndarray, lanes: int, seed: int) -> np.ndarray:
    """The lane where step ``k``'s dealing starts: ``k G`` plus a keyed shift drawn once per
    ``lanes`` steps, mod ``lanes``. Within each run of ``lanes`` steps the starts are every
    lane once, so a component dealt the same count at every step gets it equally often on
    every lane; the shift keeps a pattern in the counts (a count that alternates between 1
    and 2) from lining up with the rotation step after step, which with a plain rotation
    (2 lanes: starts 0, 1, 0, 1, ...) gives one lane the larger count every time."""
    k = np.asarray(k, dtype=np.int64)
    shift = hash32((k // lanes).astype(np.uint64), (_ROTATE_DOMAIN, seed)).astype(np.int64)
    return (k % lanes * rotation_multiplier(lanes) + shift) % lanes


def lane_step_counts(counts: np.ndarray, first_step: int, lanes: int, lane_lo: int,
                     lane_hi: int, seed: int) -> np.ndarray:
    """``n_ij(k)``: slots of component ``i`` that lane ``j`` gets at each step (``counts``:
    ``[steps, components]`` from ``first_step`` on), ``[steps, components, hi - lo]``."""
    k = np.arange(first_step, first_step + len(counts), dtype=np.int64)
    start = deal_start(k, lanes, seed)
    edges = np.concatenate([np.zeros((len(counts), 1), dtype=np.int64),
                            np.cumsum(counts, axis=1)], axis=1)
    j = np.arange(lane_lo, lane_hi, dtype=np.int64)
    u = (j[None, :] - start[:, None]) % lanes  # the stacked slots s = u (mod L) go to lane j
    # slots in [0, x) that go to lane j: ceil((x - u) / L), x >= 0 and 0 <= u < L
    before = (edges[:, :, None] - u[:, None, :] + lanes - 1) // lanes
    return np.diff(before, axis=1)


@dataclass(frozen=True)
class LaneSlots:
    """Lanes ``lo .. hi - 1`` over a range of steps: which component fills each column, and
    where in that component's lane stream the sample is (both ``[hi - lo, columns]``)."""

    component: np.ndarray
    position: np.ndarray


class LaneDeal:
    """A schedule dealt to ``lanes`` lanes in steps of ``step_samples``: the component and
    stream position of every column of a range of lanes and steps. Carries the counts and
    each lane's stream positions at the end of the last range asked for (per lane range),
    so a later range costs only the steps since. Thread-safe (a lock per deal)."""

    def __init__(self, schedule: Schedule, step_samples: int, lanes: int, seed: int) -> None:
        if lanes < 1 or step_samples % lanes:
            raise ValueError(f"the plan's {lanes} lanes do not divide the mixture's steps of "
                             f"{step_samples} samples (the global batch)")
        self.schedule, self.step_samples, self.lanes = schedule, step_samples, lanes
        self.per_lane = step_samples // lanes
        self.seed = seed
        self._lock = threading.Lock()
        n = schedule.components
        self._counts_at: tuple[int, np.ndarray] = (0, np.zeros(n, dtype=np.int64))
        self._lanes_at: dict[tuple[int, int], tuple[int, np.ndarray]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (a DataLoader worker started by spawn gets a copy): the lock stays."""
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def counts(self, k0: int, k1: int) -> np.ndarray:
        """Samples of each component in steps ``k0 .. k1 - 1``: ``[k1 - k0, components]``."""
        with self._lock:
            return self._counts(k0, k1)

    def _counts(self, k0: int, k1: int) -> np.ndarray:
        at, a_at = self._counts_at
        if at > k0:
            at, a_at = 0, np.zeros_like(a_at)
        while at < k0:  # to k0, a chunk at a time
            hi = min(k0, at + CHUNK_STEPS)
            a_at = cumulative_counts(self.schedule, self.step_samples, at, hi, a_at)[-1]
            at = hi
        parts = []
        a = a_at
        for lo in range(k0, k1, CHUNK_STEPS):
            hi = min(k1, lo + CHUNK_STEPS)
            cum = cumulative_counts(self.schedule, self.step_samples, lo, hi, a)
            parts.append(np.diff(cum, axis=0))
            a = cum[-1]
        self._counts_at = (k1, a) if k1 > k0 else (k0, a_at)
        n = self.schedule.components
        return np.concatenate(parts) if parts else np.zeros((0, n), dtype=np.int64)

    def slots(self, k0: int, k1: int, lane_lo: int, lane_hi: int) -> LaneSlots:
        """Columns of steps ``k0 .. k1 - 1`` (``c`` per step) of lanes ``lo .. hi - 1``."""
        if not 0 <= lane_lo <= lane_hi <= self.lanes:
            raise ValueError(f"lanes [{lane_lo}, {lane_hi}) outside [0, {self.lanes})")
        with self._lock:
            return self._slots(k0, k1, lane_lo, lane_hi)

    def _slots(self, k0: int, k1: int, lo: int, hi: int) -> LaneSlots:
        n, width = self.schedule.components, hi - lo
        at, pos_at = self._lanes_at.get((lo, hi), (0, np.zeros((n, width), dtype=np.int64)))
        if at > k0:
            at, pos_at = 0, np.zeros((n, width), dtype=np.int64)
        for s0 in range(at, k0, CHUNK_STEPS):  # stream positions up to k0
            s1 = min(k0, s0 + CHUNK_STEPS)
            pos_at = pos_at + lane_step_counts(self._counts(s0, s1), s0, self.lanes, lo,
                                               hi, self.seed).sum(axis=0)
        c = self.per_lane
        component = np.empty((width, (k1 - k0) * c), dtype=np.int64)
        position = np.empty_like(component)
        for s0 in range(k0, k1, CHUNK_STEPS):
            s1 = min(k1, s0 + CHUNK_STEPS)
            n_ij = lane_step_counts(self._counts(s0, s1), s0, self.lanes, lo, hi, self.seed)
            cols = slice((s0 - k0) * c, (s1 - k0) * c)
            comp = self._order(n_ij, s0, lo)
            component[:, cols] = comp
            position[:, cols] = _positions(comp, pos_at)
            pos_at = pos_at + n_ij.sum(axis=0)
        self._lanes_at[(lo, hi)] = (k1, pos_at)
        return LaneSlots(component, position)

    def _order(self, n_ij: np.ndarray, first_step: int, lo: int) -> np.ndarray:
        """Each lane's slots of each step (``n_ij``: ``[steps, components, lanes]``), in the
        order keyed by (seed, step, lane): ``[lanes, steps x c]`` component indices."""
        steps, n, width = n_ij.shape
        c = self.per_lane
        labels = np.repeat(np.tile(np.arange(n, dtype=np.int64), steps * width),
                           n_ij.transpose(0, 2, 1).reshape(-1)).reshape(steps, width, c)
        if c > 1:
            k = np.arange(first_step, first_step + steps, dtype=np.uint64)
            j = np.arange(lo, lo + width, dtype=np.uint64)
            slot = ((k[:, None] * np.uint64(self.lanes) + j[None, :])[:, :, None]
                    * np.uint64(c) + np.arange(c, dtype=np.uint64))
            order = np.argsort(hash32(slot, (_SLOT_DOMAIN, self.seed)), axis=2, kind="stable")
            shuffled = np.empty_like(labels)
            np.put_along_axis(shuffled, order, labels, axis=2)
            labels = shuffled
        return labels.transpose(1, 0, 2).reshape(width, steps * c)


def _positions(component: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Each slot's place in its component's lane stream: ``start[i, lane]`` plus the slots of
    the same component before it in the lane."""
    out = np.empty_like(component)
    for i in range(start.shape[0]):
        mine = component == i
        before = np.cumsum(mine, axis=1) - mine
        out[mine] = (start[i][:, None] + before)[mine]
    return out


def scheduled_shares(schedule: Schedule, first: int, last: int) -> list[float]:
    """The shares scheduled for steps ``first .. last - 1`` together (what the trainer logs
    beside the realised ones)."""
    t = schedule.targets([first, last], 1)
    span = t[1] - t[0]
    total = float(span.sum())
    return [float(x / total) if total > 0 else 0.0 for x in span]
