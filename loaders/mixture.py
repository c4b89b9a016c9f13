"""Mixtures: several sources sampled with fixed weights: just another :class:`Source`.

An epoch of a mixture for a plan of ``L`` lanes has ``L x floor(samples_per_epoch / L)``
samples; component ``i`` contributes exactly ``n_i`` of them, its weight's share rounded by
largest remainder (so the counts add up and proportions are exact to one sample). The
mixture's lane ``j`` draws from *the same lane* ``j`` of every component's own plan (each with
its own seed, epochs, block permutation and windows): ``n_ij`` samples of component ``i``,
where the ``n_i`` are dealt round-robin over the lanes (so every lane gets the same number of
samples and every ``n_ij`` is ``n_i / L`` rounded down or up), in an order that is a keyed
permutation of that multiset per (seed, epoch, lane). A component's lane continues into its
next epoch when the mixture asks for more than it holds.

So a rank that owns lanes ``lo .. hi - 1`` computes and reads only those lanes of every
component: everything :mod:`loaders.plan` promises for one dataset (no global order, each rank
~1/W of every component's row groups, the same global batches on any world size and worker
count, one-integer progress) holds for mixtures. Sample ids are *virtual*: component offset +
the component's own id.
"""

from __future__ import annotations

import copy
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from loaders import plan
from loaders.dataloader import ShardflowLoader, build_dataloader
from loaders.settings import LoaderSettings
from loaders.source import DatasetSource, Source, adopting_saved_plan

_MIX_DOMAIN = 0x313C


def component_counts(weights: Sequence[float], total: int) -> np.ndarray:
    """Samples per component: ``total`` split by ``weights``, largest remainder rounding."""
    w = np.asarray(weights, dtype=np.float64)
    if (w <= 0).any() or not np.isfinite(w).all():
        raise ValueError(f"mixture weights must be positive and finite, got {list(weights)}")
    exact = w / w.sum() * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


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
    """Samples from several sources by weight; implements :class:`loaders.source.Source`."""

    def __init__(self, components: Sequence[Source], weights: Sequence[float], *,
                 seed: int = 0, samples_per_epoch: int | None = None) -> None:
        if len(components) != len(weights) or not components:
            raise ValueError("give one weight per component source")
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
        self.weights = [float(w) for w in weights]
        component_counts(self.weights, 0)  # validates the weights
        self.seed = seed
        self.seq_len = first.seq_len
        self.eos_id = first.eos_id
        self.tokenizer_sha256 = first.tokenizer_sha256
        self.sizes = [c.n_samples for c in components]
        p = np.asarray(self.weights) / sum(self.weights)
        # Default epoch: as long as possible with no component repeating a sample.
        default = int(min(s / q for s, q in zip(self.sizes, p, strict=True)))
        self.n_samples = int(samples_per_epoch or default)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])

    def plan_identity(self, lanes: int) -> dict[str, Any]:
        return {"mixture_seed": self.seed, "weights": self.weights,
                "n_samples": self.n_samples,
                "components": [c.plan_identity(lanes) for c in self.components]}

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
        return self.n_samples // lanes

    def counts(self, lanes: int) -> np.ndarray:
        """Samples per component in one epoch of ``lanes`` lanes."""
        return component_counts(self.weights, lanes * self.lane_length(lanes))

    def lane_samples(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int) -> np.ndarray:
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


def build_mixture_loader(sources: Sequence[tuple[str, float]], batch_size: int, seq_len: int,
                         *, seed: int = 0, samples_per_epoch: int | None = None,
                         storage_options: dict[str, Any] | None = None,
                         **loader_kwargs: Any) -> ShardflowLoader:
    """A loader over ``[(url, weight), ...]``; same batches, state and resume as one dataset.

    Component ``i`` plans with seed ``seed + i``; the other keywords are
    ``build_dataloader``'s (``rank``, ``world_size``, ``global_batch_size``, ``lanes``,
    ``num_workers``, ``batch_thread``, ``cache_dir``, ``return_sample_id``, ...).
    """
    loader_keys = {"num_workers", "rank", "world_size", "global_batch_size", "lanes",
                   "pin_memory", "prefetch_factor", "batch_thread"}
    loader_args = {k: v for k, v in loader_kwargs.items() if k in loader_keys}
    setting_args = {k: v for k, v in loader_kwargs.items() if k not in loader_keys}
    components: list[Source] = [
        DatasetSource(url, LoaderSettings.from_kwargs(seq_len, **{**setting_args,
                                                                 "seed": seed + i}),
                      storage_options=storage_options)
        for i, (url, _w) in enumerate(sources)]
    mixture = MixtureSource(components, [w for _u, w in sources], seed=seed,
                            samples_per_epoch=samples_per_epoch)
    return build_dataloader(mixture, batch_size,
                            settings=LoaderSettings.from_kwargs(seq_len, **setting_args),
                            **loader_args)
