"""The sample plan: pure functions over integers, no I/O.

A *sample* is a window of ``seq_len + 1`` consecutive tokens (input ``w[:-1]``, labels
``w[1:]``). Windows are laid on a grid inside each row group of the dataset's token stream (all
documents of all shards in manifest order, each ending with EOS): row group ``g`` holding
``t_g`` tokens gives ``t_g // (seq_len + 1)`` samples with stride ``seq_len + 1``, so every
token is in at most one window, windows cross document boundaries, and the last
``t_g % (seq_len + 1)`` tokens of each row group (under 1 % at the default 256 k-token row
groups) are not used. No sample spans two row groups: each row group is read once per pass and
a reader holds only the row groups of the blocks it is working on.

Order: the samples of one row group form a *block*. Blocks are permuted by (seed, epoch),
then samples are permuted within windows of ``window_blocks`` consecutive blocks of that order.
A reader therefore touches only a handful of row groups at a time, while neighbours in the
output come from all over the dataset.

Split: every rank gets the same number of samples, ``ceil(N / world_size)``: the global order
is padded by repeating its first ``ceil(N/W)*W - N`` samples (fewer than ``world_size``), then
cut into contiguous slices, so ranks read mostly disjoint row groups. Within a rank, DataLoader
workers take whole batches round-robin (worker ``w`` gets batches ``w, w+W, ...``), which is
exactly the order in which ``torch.utils.data.DataLoader`` collects them: the batches a rank
sees do not depend on the number of workers.
"""

from __future__ import annotations

import numpy as np

_SEED_DOMAIN = 0x5EED_F10


def group_samples(group_tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Samples per row group: whole windows of ``seq_len + 1`` tokens inside it."""
    return np.asarray(group_tokens, dtype=np.int64) // (seq_len + 1)


def sample_starts(samples: np.ndarray, group_samples_: np.ndarray, group_token_starts: np.ndarray,
                  seq_len: int) -> np.ndarray:
    """Token offset in the global stream of each sample (vectorised)."""
    first_sample = np.concatenate([[0], np.cumsum(group_samples_)])
    samples = np.asarray(samples, dtype=np.int64)
    g = np.searchsorted(first_sample, samples, side="right") - 1
    return np.asarray(group_token_starts, dtype=np.int64)[g] + (samples - first_sample[g]) * (
        seq_len + 1)


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([_SEED_DOMAIN, seed, epoch])


def block_order(block_sizes: np.ndarray, seed: int, epoch: int, shuffle: bool = True,
                window_blocks: int = 4) -> np.ndarray:
    """The global order of sample ids for one epoch (a permutation of ``range(sum(sizes))``).

    Sample ids are numbered block after block; blocks are permuted, then samples are permuted
    within each window of ``window_blocks`` consecutive blocks of the permuted order.
    """
    sizes = np.asarray(block_sizes, dtype=np.int64)
    n = int(sizes.sum())
    if not shuffle or n == 0:
        return np.arange(n, dtype=np.int64)
    rng = _rng(seed, epoch)
    perm = rng.permutation(len(sizes))
    starts = np.concatenate([[0], np.cumsum(sizes)])[:-1]
    lengths = sizes[perm]
    # Sample ids of the permuted blocks, concatenated (vectorised ranges).
    base = np.repeat(starts[perm] - np.concatenate([[0], np.cumsum(lengths)])[:-1], lengths)
    ids = base + np.arange(n, dtype=np.int64)
    window = np.repeat(np.arange(len(perm)) // max(1, window_blocks), lengths)
    return ids[np.lexsort((rng.random(n), window))]


def epoch_order(n_samples: int, block: int, seed: int, epoch: int, shuffle: bool = True,
                window_blocks: int = 4) -> np.ndarray:
    """:func:`block_order` with blocks of ``block`` samples (the last one shorter)."""
    full, rest = divmod(n_samples, block)
    sizes = np.full(full + (1 if rest else 0), block, dtype=np.int64)
    if rest:
        sizes[-1] = rest
    return block_order(sizes, seed, epoch, shuffle, window_blocks)


def samples_per_rank(n_samples: int, world_size: int) -> int:
    return -(-n_samples // world_size)


def rank_slice(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's samples: a contiguous slice of the order padded to equal length."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    n = len(order)
    per_rank = samples_per_rank(n, world_size)
    pad = per_rank * world_size - n
    if n == 0:
        return order[:0]
    padded = np.concatenate([order, np.resize(order, pad)]) if pad else order
    return padded[rank * per_rank:(rank + 1) * per_rank]


def worker_slice(rank_order: np.ndarray, worker: int, num_workers: int,
                 batch_size: int) -> np.ndarray:
    """The samples worker ``worker`` produces: its batches, round-robin over workers."""
    if num_workers <= 1:
        return rank_order
    batch_ids = np.arange(len(rank_order)) // batch_size
    return rank_order[batch_ids % num_workers == worker]


# -- resume ------------------------------------------------------------------------------------
#
# Progress through an epoch is a list of *segments* ``(world_size, batch_size, steps)``: the
# ranks of a job with that world size each consumed ``steps`` batches of ``batch_size`` from
# the epoch's remaining sequence. One segment while nothing changes; a resume on another
# world size (or per-rank batch size) appends one. The state is therefore a few integers,
# whatever the position in the epoch.


def remaining_after(order: np.ndarray, world_size: int, batch_size: int,
                    steps: int) -> np.ndarray:
    """What is left of ``order`` after ``steps`` batches on each of ``world_size`` ranks.

    Rank ``r`` consumed the first ``steps * batch_size`` samples of its contiguous slice; the
    rest, rank by rank, is the new sequence. Padding (repeated samples) is never carried over.
    """
    n = len(order)
    per_rank = samples_per_rank(n, world_size)
    taken = min(steps * batch_size, per_rank)
    keep = np.ones(n, dtype=bool)
    for r in range(world_size):
        lo = r * per_rank
        keep[lo:min(lo + taken, n)] = False
    return order[keep]


def resume_order(order: np.ndarray, segments: list[tuple[int, int, int]]) -> np.ndarray:
    """The sequence left after all of ``segments`` (in order) were consumed."""
    for world_size, batch_size, steps in segments:
        order = remaining_after(order, world_size, batch_size, steps)
    return order


def rank_sequence(order: np.ndarray, segments: list[tuple[int, int, int]], rank: int,
                  world_size: int, batch_size: int) -> np.ndarray:
    """This rank's samples still to come in the epoch, given the progress ``segments``.

    When the last segment has the current world and batch size, it is the run in progress:
    its consumed batches are skipped inside the same contiguous slice, exactly as an
    uninterrupted run would have continued.
    """
    done = 0
    if segments and segments[-1][:2] == (world_size, batch_size):
        *segments, (_, _, done) = segments
    base = resume_order(order, list(segments))
    return rank_slice(base, rank, world_size)[done * batch_size:]
