"""Token windows -> the tensors a trainer gets: one function for every path (in-process,
DataLoader workers' parts, single samples)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np
import torch

from loaders.packing import position_ids

if TYPE_CHECKING:
    from loaders.source import Windows


@dataclass(frozen=True)
class BatchFormat:
    seq_len: int
    eos_id: int | None = None
    return_sample_id: bool = False
    return_position_ids: bool = False


def make_batch(fmt: BatchFormat, samples: np.ndarray, windows: list[np.ndarray] | np.ndarray
               ) -> dict[str, torch.Tensor]:
    """``{"input_ids": [n, L], "labels": [n, L]}`` (int64) and the optional keys, from the
    windows (a list of ``L + 1`` token arrays, or one ``[n, L + 1]`` array)."""
    n, length = len(windows), fmt.seq_len
    inputs = np.empty((n, length), dtype=np.int64)
    labels = np.empty((n, length), dtype=np.int64)
    if isinstance(windows, np.ndarray):
        inputs[:] = windows[:, :-1]
        labels[:] = windows[:, 1:]
    else:
        for i, w in enumerate(windows):
            inputs[i] = w[:-1]
            labels[i] = w[1:]
    return finish_batch(fmt, samples, inputs, labels)


def finish_batch(fmt: BatchFormat, samples: np.ndarray, inputs: np.ndarray, labels: np.ndarray
                 ) -> dict[str, torch.Tensor]:
    """The batch of already filled ``inputs`` and ``labels``, with the optional keys."""
    batch = {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}
    if fmt.return_position_ids:
        assert fmt.eos_id is not None
        batch["position_ids"] = torch.from_numpy(position_ids(inputs, fmt.eos_id))
    if fmt.return_sample_id:
        batch["sample_id"] = torch.from_numpy(np.asarray(samples, dtype=np.int64).copy())
    return batch


def batches(fmt: BatchFormat, samples: np.ndarray, windows: Windows,
            sizes: list[int]) -> Iterator[dict[str, torch.Tensor]]:
    """Consecutive batches of ``sizes[k]`` samples (0 allowed: an empty part).

    The hot loop of the in-process loader (once per sample). A batch's windows are first
    copied as they are (uint16 for most vocabularies) into one staging array, then widened to
    int64 inputs and labels in two operations for the whole batch: 0.18 CPU-s per billion
    tokens less than widening each window into its rows (``benchmarks`` aside, measured on
    windows scattered over 200 MB)."""
    it = iter(windows)
    lo = 0
    try:
        for size in sizes:
            yield finish_batch(fmt, samples[lo:lo + size], *_widen(it, size, fmt.seq_len))
            lo += size
    finally:
        it.close()  # stops the read-ahead now, not when garbage collection gets to it


def _widen(windows: Iterator[np.ndarray], size: int, seq_len: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """The next ``size`` windows as int64 ``(inputs, labels)``, ``[size, seq_len]`` each.

    The windows are gathered by one ``np.concatenate`` (which also promotes a mixture of
    vocabularies' dtypes) into a staging array, then widened in two casts for the whole batch:
    per sample only the iterator step is Python."""
    got = list(islice(windows, size))
    if len(got) != size:
        raise RuntimeError(f"the windows ran out: {len(got)} for a batch of {size}")
    inputs = np.empty((size, seq_len), dtype=np.int64)
    labels = np.empty((size, seq_len), dtype=np.int64)
    if got:
        stage = np.concatenate(got).reshape(size, seq_len + 1)
        inputs[:] = stage[:, :-1]
        labels[:] = stage[:, 1:]
    return inputs, labels


def window_chunks(samples: np.ndarray, windows: Windows, sizes: list[int],
                  seq_len: int, per_chunk: int) -> Iterator[dict[str, torch.Tensor]]:
    """What a DataLoader worker sends: for every ``per_chunk`` consecutive batches, its part
    of each (``sizes[k]`` samples, 0 allowed) as ONE int32 ``[rows, seq_len + 1]`` tensor of
    raw windows, with the sample ids and the per-batch counts. Few, compact items: a hand-off
    between processes costs per item far more than building a batch, and int32 windows are a
    quarter of the bytes of int64 inputs and labels."""
    it = iter(windows)
    lo = 0
    try:
        for k0 in range(0, len(sizes), per_chunk):
            counts = sizes[k0:k0 + per_chunk]
            rows = sum(counts)
            out = np.empty((rows, seq_len + 1), dtype=np.int32)
            for i in range(rows):
                out[i] = next(it)
            yield {"windows": torch.from_numpy(out),
                   "samples": torch.from_numpy(np.ascontiguousarray(samples[lo:lo + rows])),
                   "counts": torch.tensor(counts, dtype=torch.int64)}
            lo += rows
    finally:
        it.close()


def batches_from_chunks(fmt: BatchFormat, chunks: list[dict[str, torch.Tensor]]
                        ) -> Iterator[dict[str, torch.Tensor]]:
    """The batches of one chunk from every worker (in worker order): batch ``k`` is each
    worker's ``counts[k]`` rows, concatenated in worker order."""
    offsets = [0] * len(chunks)
    wins = [c["windows"].numpy() for c in chunks]
    ids = [c["samples"].numpy() for c in chunks]
    counts = [c["counts"].tolist() for c in chunks]
    for k in range(len(counts[0])):
        parts_w, parts_s = [], []
        for w, cnt in enumerate(counts):
            lo, hi = offsets[w], offsets[w] + cnt[k]
            parts_w.append(wins[w][lo:hi])
            parts_s.append(ids[w][lo:hi])
            offsets[w] = hi
        yield make_batch(fmt, np.concatenate(parts_s), np.concatenate(parts_w))
