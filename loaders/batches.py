"""Token windows -> the tensors a trainer gets: one function for every path (in-process,
DataLoader workers' parts, single samples)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from loaders.packing import position_ids


@dataclass(frozen=True)
class BatchFormat:
    seq_len: int
    eos_id: int | None = None
    return_sample_id: bool = False
    return_position_ids: bool = False


def make_batch(fmt: BatchFormat, samples: np.ndarray, windows: list[np.ndarray]
               ) -> dict[str, torch.Tensor]:
    """``{"input_ids": [n, L], "labels": [n, L]}`` (int64) and the optional keys."""
    n, length = len(windows), fmt.seq_len
    inputs = np.empty((n, length), dtype=np.int64)
    labels = np.empty((n, length), dtype=np.int64)
    for i, w in enumerate(windows):
        inputs[i] = w[:-1]
        labels[i] = w[1:]
    batch = {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}
    if fmt.return_position_ids:
        assert fmt.eos_id is not None
        batch["position_ids"] = torch.from_numpy(position_ids(inputs, fmt.eos_id))
    if fmt.return_sample_id:
        batch["sample_id"] = torch.from_numpy(np.asarray(samples, dtype=np.int64).copy())
    return batch


def batches(fmt: BatchFormat, samples: np.ndarray, windows: Iterator[np.ndarray],
            sizes: list[int]) -> Iterator[dict[str, torch.Tensor]]:
    """Consecutive batches of ``sizes[k]`` samples (0 allowed: an empty part)."""
    it = iter(windows)
    lo = 0
    try:
        for size in sizes:
            chunk = samples[lo:lo + size]
            lo += size
            yield make_batch(fmt, chunk, [next(it) for _ in range(size)])
    finally:
        close = getattr(windows, "close", None) or getattr(it, "close", None)
        if close is not None:
            close()  # stops the read-ahead now, not when garbage collection gets to it


def concat(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The batch made of workers' parts, in worker order."""
    if len(parts) == 1:
        return parts[0]
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
