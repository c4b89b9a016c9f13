"""The sample plan: pure functions over integers, no I/O.

A *sample* is a window of ``seq_len + 1`` consecutive tokens of the dataset's token stream
(all documents of all shards in manifest order, each ending with EOS). Windows are laid on a
fixed grid with stride ``seq_len + 1``: sample ``s`` covers tokens ``[s*(L+1), (s+1)*(L+1))``,
so every token is in exactly one window (input ``w[:-1]``, labels ``w[1:]``), windows cross
document boundaries, and the last ``total_tokens % (L+1)`` tokens (the remainder, fewer than
``L+1``) are not used.

Order: samples are grouped into *blocks* of consecutive samples (about one row group each).
Blocks are permuted by (seed, epoch), then samples are permuted within windows of a few
consecutive blocks of that order. A reader therefore touches only a handful of row groups at a
time, while neighbours in the output come from all over the dataset.

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


def num_samples(total_tokens: int, seq_len: int) -> int:
    return total_tokens // (seq_len + 1)


def block_size(mean_row_group_tokens: float, seq_len: int) -> int:
    """Samples per block: about one row group's worth, at least one."""
    return max(1, int(round(mean_row_group_tokens / (seq_len + 1))))


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([_SEED_DOMAIN, seed, epoch])


def epoch_order(n_samples: int, block: int, seed: int, epoch: int, shuffle: bool = True,
                window_blocks: int = 4) -> np.ndarray:
    """The global order of sample ids for one epoch (a permutation of ``range(n_samples)``)."""
    ids = np.arange(n_samples, dtype=np.int64)
    if not shuffle or n_samples == 0:
        return ids
    rng = _rng(seed, epoch)
    n_blocks = -(-n_samples // block)
    starts = rng.permutation(n_blocks) * block
    pieces = [ids[s:s + block] for s in starts]
    out = np.concatenate(pieces)
    span = block * window_blocks
    for lo in range(0, n_samples, span):
        rng.shuffle(out[lo:lo + span])
    return out


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


def sample_span(sample: int, seq_len: int) -> tuple[int, int]:
    """Token range ``[start, stop)`` of a sample in the global stream."""
    width = seq_len + 1
    return sample * width, (sample + 1) * width


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
