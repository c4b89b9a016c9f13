"""``TokenDataset``: a torch IterableDataset over a Shardflow dataset."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loaders import plan
from loaders.cache import DEFAULT_CACHE_BYTES, ChunkCache
from loaders.packing import position_ids
from loaders.prefetch import PrefetchingWindows
from loaders.reader import RowGroupIndex, TokenReader
from loaders.state import STATE_VERSION, LoaderStateError, check_state, plan_params
from storage import Manifest, ReplicaSet


def _worker() -> tuple[int, int]:
    """This DataLoader worker's id and the number of workers ((0, 1) in the main process)."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info else (0, 1)


def dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class TokenDataset(IterableDataset):
    """Fixed-length training windows streamed from a dataset's shards.

    Yields ``{"input_ids": LongTensor[seq_len], "labels": LongTensor[seq_len]}`` (labels are the
    inputs shifted by one), plus ``position_ids`` (restarting after each EOS) and ``sample_id``
    when asked. See :mod:`loaders.plan` for the windows, the order and the split.
    ``batch_size`` only decides how samples are dealt to DataLoader workers (whole batches,
    round-robin) so that the order a rank sees does not depend on ``num_workers``;
    ``build_dataloader`` sets it. ``segments`` is the progress through the epoch (see
    :func:`loaders.plan.rank_sequence`); the loader's ``load_state_dict`` sets it.

    ``cache_dir`` keeps the verified pieces read from the store on local disk (see
    :mod:`loaders.cache`), at most ``cache_bytes`` of them (default
    :data:`loaders.cache.DEFAULT_CACHE_BYTES`, 16 GiB), least recently used evicted first: from
    the second epoch on, a dataset that fits is read from local disk only. The directory may be
    shared by every rank, worker and dataset on the host.

    ``read_threads`` (default 2) fetch and decode row groups ahead, ``lookahead_groups`` of
    them beyond the current one. Two suffice for local disk (loader_throughput
    ``shardflow_local_rt4``: four give the same rate and CPU per token) and leave more cores
    to the trainer; raise it for stores with long round trips.

    ``state_dict()``/``load_state_dict()`` make it *Stateful* in ``torchdata``'s sense, for
    ``torchdata.stateful_dataloader.StatefulDataLoader``, which saves one state per worker: the
    epoch, the progress ``segments`` the iteration started from, how many samples this worker
    has yielded since, and the plan. Resuming needs the same rank, world size, ``batch_size``
    and ``num_workers`` (each worker skips its own first samples); to resume across those, use
    ``build_dataloader``'s loader, whose state is per rank.
    """

    def __init__(self, url: str, seq_len: int, *, seed: int = 0, shuffle: bool = True,
                 rank: int | None = None, world_size: int | None = None,
                 storage_options: dict[str, Any] | None = None, batch_size: int = 1,
                 return_sample_id: bool = False, return_position_ids: bool = False,
                 manifest: Manifest | None = None, replicas: list[str] | None = None,
                 replica_options: list[dict[str, Any] | None] | None = None,
                 lookahead_groups: int = 16, read_threads: int = 2,
                 window_blocks: int = 16, cache_dir: str | os.PathLike[str] | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        super().__init__()
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        self.url = url
        self.seq_len = seq_len
        self.seed = seed
        self.shuffle = shuffle
        self.batch_size = batch_size
        self.return_sample_id = return_sample_id
        self.return_position_ids = return_position_ids
        self.lookahead_groups = lookahead_groups
        self.read_threads = read_threads
        self.window_blocks = window_blocks
        if cache_bytes < 1:
            raise ValueError(f"cache_bytes must be >= 1, got {cache_bytes}")
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.cache_bytes = cache_bytes
        self._rank, self._world_size = rank, world_size
        # All reads go through the replica set: the first URL is preferred, the others are
        # failover copies (each may have its own storage options: endpoint, credentials).
        self.store = ReplicaSet.from_urls([url, *(replicas or [])], storage_options,
                                          replica_options)
        self.manifest = manifest or self.store.read_manifest()
        self.eos_id = self.manifest.eos_id
        if return_position_ids and self.eos_id is None:
            raise ValueError("position_ids need the tokenizer's EOS id; the manifest has none")
        self.index = RowGroupIndex(self.manifest)
        self.group_samples = plan.group_samples(np.diff(self.index.starts), seq_len)
        self.n_samples = int(self.group_samples.sum())
        # Blocks are row groups; their count stands for the block layout in saved states.
        self.block = len(self.group_samples)
        self.epoch = 0
        self.segments: list[tuple[int, int, int]] = []
        self._reader: TokenReader | None = None
        # Stateful progress of the current iteration (this process's worker only):
        self._started: tuple[int, list[tuple[int, int, int]]] | None = None  # epoch, segments
        self._yielded = 0
        self._resume_skip = 0  # samples to skip at the next __iter__, set by load_state_dict

    @property
    def rank(self) -> int:
        return self._rank if self._rank is not None else dist_rank_world()[0]

    @property
    def world_size(self) -> int:
        return self._world_size if self._world_size is not None else dist_rank_world()[1]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration follows (call on every rank)."""
        if epoch != self.epoch:
            self.segments = []
            self._started, self._yielded, self._resume_skip = None, 0, 0
        self.epoch = epoch

    def __len__(self) -> int:
        """Samples this rank yields in a whole epoch (the same on every rank)."""
        return plan.samples_per_rank(self.n_samples, self.world_size)

    @property
    def padding(self) -> int:
        """Samples repeated per epoch so that every rank gets as many as the others."""
        return len(self) * self.world_size - self.n_samples

    def order_for_epoch(self, epoch: int) -> np.ndarray:
        return plan.block_order(self.group_samples, self.seed, epoch, self.shuffle,
                                self.window_blocks)

    def epoch_order(self) -> np.ndarray:
        return self.order_for_epoch(self.epoch)

    def sample_starts(self, samples: np.ndarray) -> np.ndarray:
        """Token offset of each sample in the dataset's token stream."""
        return plan.sample_starts(samples, self.group_samples, self.index.starts[:-1],
                                  self.seq_len)

    def rank_order(self) -> np.ndarray:
        """This rank's samples still to come in the current epoch, in order."""
        return plan.rank_sequence(self.epoch_order(), self.segments, self.rank,
                                  self.world_size, self.batch_size)

    def worker_samples(self) -> np.ndarray:
        worker, workers = _worker()
        return plan.worker_slice(self.rank_order(), worker, workers, self.batch_size)

    @property
    def reader(self) -> TokenReader:
        if self._reader is None:
            cache = ChunkCache(self.cache_dir, self.cache_bytes) if self.cache_dir else None
            self._reader = TokenReader(self.store, self.index, cache)
        return self._reader

    def windows(self, samples: np.ndarray) -> PrefetchingWindows:
        """The token windows (``seq_len + 1`` int32 each) of ``samples``, read ahead."""
        return PrefetchingWindows(self.reader, self.sample_starts(samples), self.seq_len,
                                  self.lookahead_groups, self.read_threads)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # Not a generator function: the progress is reset (or the resume point taken) when the
        # iterator is made, which is when StatefulDataLoader reads a worker's first state.
        skip, self._resume_skip = self._resume_skip, 0
        self._started = (self.epoch, list(self.segments))
        self._yielded = skip
        return self._items(self.worker_samples()[skip:])

    def _items(self, samples: np.ndarray) -> Iterator[dict[str, torch.Tensor]]:
        for sample, window in zip(samples.tolist(), self.windows(samples), strict=True):
            tokens = torch.from_numpy(window.astype(np.int64))
            item = {"input_ids": tokens[:-1], "labels": tokens[1:]}
            if self.return_position_ids:
                item["position_ids"] = torch.from_numpy(position_ids(window[None, :-1],
                                                                     self.eos_id)[0])
            if self.return_sample_id:
                item["sample_id"] = torch.tensor(sample)
            self._yielded += 1  # before the yield: the state after a batch counts all of it
            yield item

    # -- Stateful (torchdata) ----------------------------------------------------------------

    def _layout(self) -> dict[str, int]:
        worker, workers = _worker()
        return {"rank": self.rank, "world_size": self.world_size, "batch_size": self.batch_size,
                "worker": worker, "num_workers": workers}

    def state_dict(self) -> dict[str, Any]:
        """This worker's place in the epoch: a few integers, whatever the position."""
        epoch, segments = self._started or (self.epoch, list(self.segments))
        return {"version": STATE_VERSION, "epoch": epoch,
                "segments": [list(s) for s in segments], "layout": self._layout(),
                "yielded": self._yielded, "plan": plan_params(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``__iter__`` continue after the samples ``state`` had yielded."""
        check_state(state, self)
        saved, mine = state.get("layout"), self._layout()
        if saved != mine:
            raise LoaderStateError(
                f"worker state saved with layout {saved}, now {mine}: a StatefulDataLoader "
                "resumes on the same rank, world size, batch_size and num_workers (the "
                "build_dataloader loader's state resumes across them)")
        self.epoch = int(state["epoch"])
        self.segments = [(int(w), int(b), int(n)) for w, b, n in state["segments"]]
        self._started, self._yielded = None, 0
        self._resume_skip = int(state["yielded"])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None  # open files and caches stay in the process that made them
        return state
