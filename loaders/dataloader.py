"""``build_dataloader``: a ready torch DataLoader of batches over a Shardflow dataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from loaders.dataset import TokenDataset


class ShardflowLoader:
    """Iterates the batches of one epoch for this rank; ``set_epoch`` moves to the next.

    A thin owner of a ``torch.utils.data.DataLoader``: it keeps the dataset and loader
    settings together so that later it can also carry ``state_dict()`` for exact resume.
    """

    def __init__(self, dataset: TokenDataset, batch_size: int, num_workers: int,
                 pin_memory: bool, prefetch_factor: int | None) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self._loader = DataLoader(
            dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=False, drop_last=False)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def __len__(self) -> int:
        """Batches per epoch on this rank; equal on every rank."""
        return -(-len(self.dataset) // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter(self._loader)


def build_dataloader(url: str, batch_size: int, seq_len: int, num_workers: int = 2, *,
                     pin_memory: bool | None = None, prefetch_factor: int | None = 4,
                     **dataset_kwargs: Any) -> ShardflowLoader:
    """A loader of ``{"input_ids": [B, L], "labels": [B, L]}`` batches for this rank.

    ``dataset_kwargs`` go to :class:`TokenDataset` (``seed``, ``shuffle``, ``rank``,
    ``world_size``, ``storage_options``, ...). Every rank gets the same number of batches.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dataset = TokenDataset(url, seq_len, batch_size=batch_size, **dataset_kwargs)
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    return ShardflowLoader(dataset, batch_size, num_workers, pin_memory, prefetch_factor)
