"""Mixtures: several datasets sampled with fixed weights, deterministic and resumable.

An epoch of a mixture has ``samples_per_epoch`` samples; component ``i`` contributes exactly
``n_i`` of them, its weight's share rounded by largest remainder (so the counts add up and
proportions are exact to one sample). Which component fills each position is a seeded
permutation of that multiset; each component walks its own plan (its own epochs, block
shuffle and all), continuing into its next epoch when the mixture asks for more samples than
it holds. The mixture's order is an array of *virtual* sample ids (component offset + local
id), so ranks, workers, ``state_dict`` and elastic resume work exactly as for one dataset.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from loaders.dataloader import ShardflowLoader
from loaders.dataset import TokenDataset

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


def mixture_order(counts: np.ndarray, sizes: Sequence[int], component_orders, seed: int,
                  epoch: int) -> np.ndarray:
    """Virtual ids for one mixture epoch (pure: ``component_orders(i, e)`` gives an order).

    Component ``i``'s j-th contribution in mixture epoch ``epoch`` is element
    ``(epoch * counts[i] + j)`` of the concatenation of its own epochs' orders.
    """
    offsets = np.concatenate([[0], np.cumsum(sizes)])[:-1]
    rng = np.random.default_rng([_MIX_DOMAIN, seed, epoch])
    slots = rng.permutation(np.repeat(np.arange(len(counts)), counts))
    out = np.empty(len(slots), dtype=np.int64)
    for i, n in enumerate(counts.tolist()):
        if n == 0:
            continue
        size = sizes[i]
        start = epoch * n
        picks = []
        e, pos = divmod(start, size)
        need = n
        while need:
            order = component_orders(i, e)
            take = min(need, size - pos)
            picks.append(order[pos:pos + take])
            need -= take
            e, pos = e + 1, 0
        out[slots == i] = np.concatenate(picks) + offsets[i]
    return out


class MixtureDataset(TokenDataset):
    """A :class:`TokenDataset` whose samples come from several datasets by weight."""

    def __init__(self, components: Sequence[TokenDataset], weights: Sequence[float], *,
                 seed: int = 0, samples_per_epoch: int | None = None) -> None:
        if len(components) != len(weights) or not components:
            raise ValueError("give one weight per component dataset")
        first = components[0]
        if any(c.seq_len != first.seq_len for c in components):
            raise ValueError("all mixture components need the same seq_len")
        if len({c.eos_id for c in components}) > 1 or len(
                {c.manifest.tokenizer.sha256 for c in components}) > 1:
            raise ValueError("mixture components were tokenized differently (tokenizer hashes "
                             "differ): their token ids do not mean the same thing")
        # Share everything but the plan with the first component (rank, batch, options).
        self.__dict__.update(first.__dict__)
        self.components = list(components)
        self.weights = [float(w) for w in weights]
        self.seed = seed
        self.sizes = [c.n_samples for c in components]
        p = np.asarray(self.weights) / sum(self.weights)
        # Default epoch: as long as possible with no component repeating a sample.
        default = int(min(s / q for s, q in zip(self.sizes, p, strict=True)))
        self.n_samples = samples_per_epoch or default
        self.counts = component_counts(self.weights, self.n_samples)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self.block = 0
        self.segments = []
        self.epoch = 0

    def _component_order(self, i: int, epoch: int) -> np.ndarray:
        return self.components[i].order_for_epoch(epoch)

    def epoch_order(self) -> np.ndarray:
        return mixture_order(self.counts, self.sizes, self._component_order, self.seed,
                             self.epoch)

    def windows(self, samples: np.ndarray) -> Iterator[np.ndarray]:
        comp = np.searchsorted(self.offsets, samples, side="right") - 1
        streams = [iter(c.windows(samples[comp == i] - self.offsets[i]))
                   for i, c in enumerate(self.components)]
        for i in comp.tolist():
            yield next(streams[i])

    def source_of(self, samples: np.ndarray) -> np.ndarray:
        """Which component each virtual sample id comes from."""
        return np.searchsorted(self.offsets, samples, side="right") - 1


def build_mixture_loader(sources: Sequence[tuple[str, float]], batch_size: int, seq_len: int,
                         *, seed: int = 0, samples_per_epoch: int | None = None,
                         num_workers: int = 0, prefetch_factor: int = 4,
                         pin_memory: bool = False, batch_thread: bool = False,
                         **dataset_kwargs: Any) -> ShardflowLoader:
    """A loader over ``[(url, weight), ...]``; same batches, state and resume as one dataset."""
    components = [TokenDataset(url, seq_len, seed=seed + i, batch_size=batch_size,
                               **dataset_kwargs) for i, (url, _w) in enumerate(sources)]
    mixture = MixtureDataset(components, [w for _u, w in sources], seed=seed,
                             samples_per_epoch=samples_per_epoch)
    return ShardflowLoader(mixture, batch_size, num_workers, pin_memory, prefetch_factor,
                           batch_thread)
