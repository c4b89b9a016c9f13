"""Mixtures: several sources sampled by weight, fixed or scheduled: just another :class:`Source`.

**Fixed weights.** An epoch of a mixture for a plan of ``L`` lanes has
``L x floor(samples_per_epoch / L)`` samples; component ``i`` contributes exactly ``n_i`` of
them, its weight's share rounded by largest remainder (so the counts add up and proportions are
exact to one sample). The mixture's lane ``j`` draws from *the same lane* ``j`` of every
component's own plan (each with its own seed, epochs, block permutation and windows): ``n_ij``
samples of component ``i``, where the ``n_i`` are dealt round-robin over the lanes (so every
lane gets the same number of samples and every ``n_ij`` is ``n_i / L`` rounded down or up), in
an order that is a keyed permutation of that multiset per (seed, epoch, lane). A component's
lane continues into its next epoch when the mixture asks for more than it holds. A weight may
be 0 (that component is not read), as long as one is positive.

**Scheduled weights** (:mod:`loaders.mixture_schedule`: weights at given steps, held or
linear between them). The unit is the *step*, one global batch of ``step_samples`` samples,
``c = step_samples / L`` columns of every lane. Step ``k``'s counts per component follow the
schedule cumulatively (largest remainder of the scheduled totals so far, so any run of steps
has its scheduled share to within a few samples per component), its slots are dealt round the
lanes from a start that rotates with ``k``, and each lane's slots of a step are put in a keyed
order; lane ``j`` of component ``i`` is read as a stream continuing across the component's
epochs, at the position the lane's earlier slots of ``i`` reached. An epoch of a scheduled
mixture is ``floor(samples_per_epoch / step_samples)`` whole steps, so the trainer's step
``k + 1`` is always step ``k`` of the schedule. A schedule of one point is a fixed mixture,
with the fixed mixture's batches.

Either way a rank that owns lanes ``lo .. hi - 1`` computes and reads only those lanes of every
component: everything :mod:`loaders.plan` promises for one dataset (no global order, each rank
~1/W of every component's row groups, the same global batches on any world size and worker
count, one-integer progress) holds for mixtures, and a resume on another world size in the
middle of a ramp continues the same global batches. Sample ids are *virtual*: component offset
+ the component's own id (:meth:`MixtureSource.source_of` maps them back).
"""

from __future__ import annotations

import copy
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from loaders import plan
from loaders.dataloader import ShardflowLoader, build_dataloader
from loaders.mixture_schedule import LaneDeal, Schedule, apportion
from loaders.settings import LoaderSettings
from loaders.source import DatasetSource, Source, adopting_saved_plan

_MIX_DOMAIN = 0x313C


def component_counts(weights: Sequence[float], total: int) -> np.ndarray:
    """Samples per component: ``total`` split by ``weights`` (finite, >= 0, not all 0),
    largest remainder rounding."""
    w = np.asarray(weights, dtype=np.float64)
    if (w < 0).any() or not np.isfinite(w).all() or not w.sum() > 0:
        raise ValueError("mixture weights must be finite and >= 0, at least one positive, "
                         f"got {list(weights)}")
    return apportion(w, total)


def lane_counts(counts: np.ndarray, lanes: int, lane_lo: int, lane_hi: int) -> np.ndarray:
    """``n_ij``: samples of component ``i`` in lane ``j`` (``[components, hi - lo]``).

    The ``sum(counts)`` slots (component 0's first, then 1's, ...) are dealt round-robin over
    the lanes, slot ``s`` to lane ``s mod L``.
    """
    edges = np.concatenate([[0], np.cumsum(counts)])
    j = np.arange(lane_lo, lane_hi, dtype=np.int64)

    def before(x: np.ndarray) -> np.ndarray:  # slots < x that go to lane j
        return np.maximum(0, -(-(x[:, None] - j[None, :]) // lanes))

    return before(edges[1:]) - before(edges[:-1])


class MixtureSource:
    """Samples from several sources by weight; implements :class:`loaders.source.Source`.

    ``weights``: one per component, or a :class:`loaders.mixture_schedule.Schedule` (then
    ``step_samples``, the global batch, is needed when it has more than one point)."""

    def __init__(self, components: Sequence[Source], weights: Sequence[float] | Schedule, *,
                 seed: int = 0, samples_per_epoch: int | None = None,
                 step_samples: int | None = None) -> None:
        schedule = weights if isinstance(weights, Schedule) else None
        if schedule is not None and schedule.constant:  # one point: the fixed mixture
            weights, schedule = list(schedule.weights[0]), None
        n_weights = schedule.components if schedule is not None else len(weights)
        if len(components) != n_weights or not components:
            raise ValueError("give one weight per component source")
        if schedule is not None and (step_samples is None or step_samples < 1):
            raise ValueError("a mixture schedule counts steps: give step_samples, the global "
                             "batch size")
        first = components[0]
        if any(c.seq_len != first.seq_len for c in components):
            raise ValueError("all mixture components need the same seq_len")
        tokenizers = {c.tokenizer_sha256 for c in components}
        if len({c.eos_id for c in components}) > 1 or len(tokenizers) > 1:
            raise ValueError("mixture components were tokenized differently (tokenizer hashes "
                             "differ): their token ids do not mean the same thing")
        if any(c.n_samples == 0 for c in components):
            raise ValueError("a mixture component has no samples")
        self.components = list(components)
        #: the scheduled mixture's schedule and step (None: fixed ``weights``)
        self.schedule = schedule
        self.step_samples = step_samples if schedule is not None else None
        if schedule is None:
            self.weights: list[float] | None = [float(w) for w in weights]  # type: ignore[union-attr]
            component_counts(self.weights, 0)  # validates the weights
            points = np.asarray([self.weights]) / sum(self.weights)
        else:
            self.weights = None
            points = schedule.shares
        self.seed = seed
        self.seq_len = first.seq_len
        self.eos_id = first.eos_id
        self.tokenizer_sha256 = first.tokenizer_sha256
        self.sizes = [c.n_samples for c in components]
        # Default epoch: as long as possible with no component repeating a sample (at the
        # weights of any one point of a schedule).
        default = int(min(s / q for row in points for s, q in zip(self.sizes, row, strict=True)
                          if q > 0))
        self.n_samples = int(samples_per_epoch or default)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self._deals: dict[int, LaneDeal] = {}

    def plan_identity(self, lanes: int) -> dict[str, Any]:
        components = [c.plan_identity(lanes) for c in self.components]
        if self.schedule is None:  # what every state of a fixed mixture has held
            return {"mixture_seed": self.seed, "weights": self.weights,
                    "n_samples": self.n_samples, "components": components}
        return {"mixture_seed": self.seed, "schedule": self.schedule.identity(),
                "step_samples": self.step_samples, "n_samples": self.n_samples,
                "components": components}

    def adopting(self, saved: dict[str, Any]) -> MixtureSource:
        """This mixture with each component on its saved plan
        (:func:`loaders.source.adopting_saved_plan`), when the state has one per component."""
        theirs = saved.get("components")
        if not isinstance(theirs, list) or len(theirs) != len(self.components):
            return self
        components = [adopting_saved_plan(c, {"plan": t})
                      for c, t in zip(self.components, theirs, strict=True)]
        if all(a is c for a, c in zip(components, self.components, strict=True)):
            return self
        adopted = copy.copy(self)
        adopted.components = components
        return adopted

    def lane_length(self, lanes: int) -> int:
        if self.schedule is None:
            return self.n_samples // lanes
        c = self.deal(lanes).per_lane  # whole steps: the trainer's steps are the schedule's
        return self.n_samples // lanes // c * c

    def deal(self, lanes: int) -> LaneDeal:
        """The schedule dealt to ``lanes`` lanes (one per lane count, kept: it carries each
        lane range's stream positions from one epoch to the next)."""
        assert self.schedule is not None and self.step_samples is not None
        found = self._deals.get(lanes)
        if found is None:
            found = self._deals.setdefault(
                lanes, LaneDeal(self.schedule, self.step_samples, lanes, self.seed))
        return found

    def counts(self, lanes: int) -> np.ndarray:
        """Samples per component in one epoch of ``lanes`` lanes (a fixed mixture)."""
        assert self.weights is not None, "a scheduled mixture's counts change by step"
        return component_counts(self.weights, lanes * self.lane_length(lanes))

    def lane_samples(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int) -> np.ndarray:
        if self.schedule is not None:
            return self._scheduled_lanes(epoch, lanes, lane_lo, lane_hi)
        m = self.lane_length(lanes)
        n_ij = lane_counts(self.counts(lanes), lanes, lane_lo, lane_hi)
        out = np.empty((lane_hi - lane_lo, m), dtype=np.int64)
        picks: list[list[np.ndarray]] = [[] for _ in range(lane_hi - lane_lo)]
        for i, comp in enumerate(self.components):
            m_i = comp.lane_length(lanes)
            if m_i == 0 and n_ij[i].any():
                raise ValueError(f"mixture component {i} has fewer samples than lanes")
            start, stop = epoch * n_ij[i], (epoch + 1) * n_ij[i]  # in its lanes' streams
            blocks: dict[int, np.ndarray] = {}
            for e in range(int(start.min() // max(m_i, 1)),
                           int((stop.max() - 1) // max(m_i, 1)) + 1 if stop.max() else 0):
                blocks[e] = comp.lane_samples(e, lanes, lane_lo, lane_hi)
            for row in range(lane_hi - lane_lo):
                if not n_ij[i, row]:
                    picks[row].append(np.zeros(0, dtype=np.int64))
                    continue
                t = np.arange(start[row], stop[row])
                e, pos = np.divmod(t, m_i)
                got = np.empty(len(t), dtype=np.int64)
                for ep in np.unique(e).tolist():
                    sel = e == ep
                    got[sel] = blocks[ep][row, pos[sel]]
                picks[row].append(got + self.offsets[i])
        for row, j in enumerate(range(lane_lo, lane_hi)):
            rng = np.random.default_rng([_MIX_DOMAIN, self.seed, epoch, j])
            slots = rng.permutation(np.repeat(np.arange(len(self.components)), n_ij[:, row]))
            for i, got in enumerate(picks[row]):
                out[row, slots == i] = got
        return out

    def _scheduled_lanes(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int
                         ) -> np.ndarray:
        """The lanes of an epoch of a scheduled mixture: its steps dealt
        (:meth:`loaders.mixture_schedule.LaneDeal.slots`), each slot the sample at its
        position in lane ``j`` of its component's plan, across the component's epochs."""
        deal = self.deal(lanes)
        m = self.lane_length(lanes)
        steps = m // deal.per_lane
        slots = deal.slots(epoch * steps, (epoch + 1) * steps, lane_lo, lane_hi)
        out = np.empty((lane_hi - lane_lo, m), dtype=np.int64)
        for i, comp in enumerate(self.components):
            rows, cols = np.nonzero(slots.component == i)
            if not len(rows):
                continue
            m_i = comp.lane_length(lanes)
            if m_i == 0:
                raise ValueError(f"mixture component {i} has fewer samples than lanes")
            e, pos = np.divmod(slots.position[rows, cols], m_i)
            for ep in np.unique(e).tolist():
                sel = e == ep
                lanes_of = comp.lane_samples(ep, lanes, lane_lo, lane_hi)
                out[rows[sel], cols[sel]] = lanes_of[rows[sel], pos[sel]] + self.offsets[i]
        return out

    def lane_plan(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int
                  ) -> plan.WholeLanes:
        """The lanes drawn whole: the per-lane slot permutation is not cut by column."""
        return plan.WholeLanes(self.lane_samples(epoch, lanes, lane_lo, lane_hi))

    def source_of(self, samples: np.ndarray) -> np.ndarray:
        """Which component each virtual sample id comes from."""
        return np.searchsorted(self.offsets, samples, side="right") - 1

    def windows(self, samples: np.ndarray) -> Generator[np.ndarray, None, None]:
        samples = np.asarray(samples, dtype=np.int64)
        comp = self.source_of(samples)
        streams = [iter(c.windows(samples[comp == i] - self.offsets[i]))
                   for i, c in enumerate(self.components)]
        try:
            for i in comp.tolist():
                yield next(streams[i])
        finally:
            for s in streams:
                s.close()

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for c in self.components:
            for k, v in c.metrics().items():
                out[k] = out.get(k, 0.0) + v
        return out


def build_mixture_loader(sources: Sequence[tuple[str, float]] | Sequence[str],
                         batch_size: int, seq_len: int,
                         *, seed: int = 0, samples_per_epoch: int | None = None,
                         storage_options: dict[str, Any] | None = None,
                         schedule: Schedule | None = None,
                         **loader_kwargs: Any) -> ShardflowLoader:
    """A loader over ``[(url, weight), ...]``, or over ``[url, ...]`` with a ``schedule``
    (:class:`loaders.mixture_schedule.Schedule`: weights that change by step); same batches,
    state and resume as one dataset.

    Component ``i`` plans with seed ``seed + i``; the other keywords are
    ``build_dataloader``'s (``rank``, ``world_size``, ``global_batch_size``, ``lanes``,
    ``num_workers``, ``batch_thread``, ``cache_dir``, ``return_sample_id``, ...). A schedule
    counts steps of the global batch: give ``global_batch_size`` (or ``world_size``), which
    a resume must keep anyway.
    """
    weights: Sequence[float] | Schedule
    if schedule is not None:
        if not all(isinstance(s, str) for s in sources):
            raise ValueError("with a schedule, give the components' URLs only (the schedule "
                             "holds the weights)")
        urls = [str(s) for s in sources]
        weights = schedule
    else:
        urls = [u for u, _w in sources]  # type: ignore[misc]
        weights = [w for _u, w in sources]  # type: ignore[misc]
    step_samples = loader_kwargs.get("global_batch_size")
    if step_samples is None and loader_kwargs.get("world_size") is not None:
        step_samples = batch_size * int(loader_kwargs["world_size"])
    if schedule is not None and not schedule.constant and step_samples is None:
        raise ValueError("a mixture schedule counts steps of the global batch: pass "
                         "global_batch_size (or world_size)")
    loader_keys = {"num_workers", "rank", "world_size", "global_batch_size", "lanes",
                   "pin_memory", "prefetch_factor", "batch_thread"}
    loader_args = {k: v for k, v in loader_kwargs.items() if k in loader_keys}
    setting_args = {k: v for k, v in loader_kwargs.items() if k not in loader_keys}
    components: list[Source] = [
        DatasetSource(url, LoaderSettings.from_kwargs(seq_len, **{**setting_args,
                                                                 "seed": seed + i}),
                      storage_options=storage_options)
        for i, url in enumerate(urls)]
    mixture = MixtureSource(components, weights, seed=seed,
                            samples_per_epoch=samples_per_epoch, step_samples=step_samples)
    return build_dataloader(mixture, batch_size,
                            settings=LoaderSettings.from_kwargs(seq_len, **setting_args),
                            **loader_args)
