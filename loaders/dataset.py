"""``TokenDataset``: a torch IterableDataset over a source, for any torch DataLoader.

``build_dataloader`` (:mod:`loaders.dataloader`) is the loader to use: per-rank state that
resumes across world sizes and worker counts, and DataLoader workers that each decode only
their own row groups. This class serves the generic path: ``torch.utils.data.DataLoader`` or
``torchdata``'s ``StatefulDataLoader`` collating single samples.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loaders import plan
from loaders.batches import BatchFormat, make_batch
from loaders.plan import Layout, Progress
from loaders.settings import LoaderSettings
from loaders.source import DatasetSource, Source, Windows, rank_stream, resume_on_saved_plan
from loaders.state import (
    LoaderStateError,
    make_state,
)
from loaders.world import (  # noqa: F401  (dist_rank_world, make_layout: imported from here)
    LayoutSpec,
    WorldNotReadyError,
    dist_rank_world,
    make_layout,
    rank_world,
)

#: DataLoader workers whose whole passes a TokenDataset counts (one shared slot per worker id;
#: more workers than this read their epochs as told by ``set_epoch`` only)
PASS_SLOTS = 256


def _worker() -> tuple[int, int]:
    """This DataLoader worker's id and the number of workers ((0, 1) in the main process)."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info else (0, 1)


def open_source(url: str | Source, settings: LoaderSettings, **store: Any) -> Source:
    if isinstance(url, str):
        return DatasetSource(url, settings, **store)
    if store:
        raise TypeError(f"store options {sorted(store)} given with a ready source")
    return url


class TokenDataset(IterableDataset):
    """Fixed-length training windows of this rank's lanes, sample by sample.

    Yields ``{"input_ids": LongTensor[seq_len], "labels": LongTensor[seq_len]}`` (labels are
    the inputs shifted by one), plus ``position_ids`` and ``sample_id`` when asked. The order
    is the plan's (:mod:`loaders.plan`) for a global batch of ``global_batch_size``
    (default ``batch_size x world_size``) over ``lanes`` lanes (default: the global batch).
    DataLoader workers take whole batches of ``batch_size`` round-robin, so the order does
    not depend on their number (each worker decodes what its batches need).

    Epochs: iterating again after a whole pass reads the next epoch, unless ``set_epoch``
    chose one since (the finished epoch again, or another). Under a DataLoader with
    workers each pass is read by copies of this dataset; they record the epoch each worker
    read whole in memory shared with the copy they came from, so a new pass's workers, even
    fresh ones, move on too.

    Keywords: ``rank``/``world_size`` (default: torch.distributed's, asked when needed: the
    group may be made after the dataset; with no group and ``WORLD_SIZE`` > 1 it refuses,
    :class:`loaders.world.WorldNotReadyError`; a DataLoader worker started by ``spawn``
    takes its parent's), ``storage_options``,
    ``replicas``, ``replica_options``, ``manifest``, and the settings of
    :class:`loaders.settings.LoaderSettings` (``seed``, ``shuffle``, ``window_blocks``,
    ``run_blocks``, ``lookahead_groups``, ``read_threads``, ``cache_dir``, ``cache_bytes``,
    ``readahead_bytes``, ``return_sample_id``, ``return_position_ids``), or ``settings=``
    directly.

    ``state_dict()``/``load_state_dict()`` make it *Stateful* in ``torchdata``'s sense (one
    state per worker): resuming needs the same rank, world size, batch size and
    ``num_workers``; ``build_dataloader``'s loader resumes across them.
    """

    def __init__(self, url: str | Source, seq_len: int | None = None, *,
                 rank: int | None = None, world_size: int | None = None, batch_size: int = 1,
                 global_batch_size: int | None = None, lanes: int | None = None,
                 settings: LoaderSettings | None = None,
                 storage_options: dict[str, Any] | None = None,
                 replicas: list[str] | None = None,
                 replica_options: list[dict[str, Any] | None] | None = None,
                 manifest: Any = None, **setting_kwargs: Any) -> None:
        super().__init__()
        # checks the batch sizes now (and the layout, when rank/world are given)
        self._spec = LayoutSpec(batch_size, global_batch_size, lanes, rank, world_size)
        settings = LoaderSettings.given(settings, seq_len, setting_kwargs)
        self.settings = settings
        store = {k: v for k, v in (("storage_options", storage_options), ("replicas", replicas),
                                   ("replica_options", replica_options),
                                   ("manifest", manifest)) if v is not None}
        self.source = open_source(url, settings, **store)
        self.seq_len = settings.seq_len
        self.batch_size = batch_size
        self._rank, self._world_size = rank, world_size
        self.progress = Progress()
        #: the epoch each DataLoader worker (by id; 0 in the main process) last read whole,
        #: shared with the copies workers make (-1: none since the last ``set_epoch``)
        self._passes = torch.full((PASS_SLOTS,), -1, dtype=torch.int64).share_memory_()
        self.format = BatchFormat(self.seq_len, self.source.eos_id, settings.return_sample_id,
                                  settings.return_position_ids)
        # Stateful progress of the current iteration (this process's worker only):
        self._started: Progress | None = None
        self._yielded = 0
        self._whole = False  # this copy read its whole part of ``_started``'s epoch
        #: samples to skip at the next __iter__, set by load_state_dict (None: no resume)
        self._resume_skip: int | None = None

    # -- where this rank stands --------------------------------------------------------------

    def _rank_world(self) -> tuple[int, int]:
        if self._rank is not None and self._world_size is not None:
            return self._rank, self._world_size
        return rank_world("this TokenDataset")

    @property
    def rank(self) -> int:
        return self._rank_world()[0]

    @property
    def world_size(self) -> int:
        return self._rank_world()[1]

    @property
    def layout(self) -> Layout:
        return self._spec.make(*self._rank_world())

    def __getstate__(self) -> dict[str, Any]:
        """A copy for a DataLoader worker: with the rank and world size of this process when
        it has a process group, which a worker started by ``spawn`` (or ``forkserver``)
        would not find."""
        state = self.__dict__.copy()
        if self._rank is None:
            with contextlib.suppress(WorldNotReadyError):  # the copy asks again, refusing
                state["_rank"], state["_world_size"] = self._rank_world()
        return state

    @property
    def n_samples(self) -> int:
        return self.source.n_samples

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads (call on every rank): from its start,
        except the epoch a loaded state stands in, which continues."""
        if epoch != self.progress.epoch or self._resume_skip is None:
            self._started, self._yielded, self._resume_skip = None, 0, None
            self.progress = Progress(epoch)
        self._whole = False
        self._passes.fill_(-1)

    def _pass_epoch(self, workers: int) -> int:
        """The epoch a new pass reads: this copy's, or the one after the epoch every worker
        of the last pass read whole (the copies of a new pass start from the same dataset,
        so they agree)."""
        done = int(self._passes[:min(workers, PASS_SLOTS)].min())
        return max(self.progress.epoch, done + 1)

    def lane_length(self) -> int:
        return self.source.lane_length(self.layout.lanes)

    def __len__(self) -> int:
        """Samples this rank yields in a whole epoch (the same on every rank)."""
        return self.layout.lanes_per_rank * self.lane_length()

    @property
    def padding(self) -> int:
        """Samples repeated per epoch (at most one per lane) so that lanes are equal."""
        return self.layout.lanes * self.lane_length() - self.n_samples

    def rank_stream(self, progress: Progress | None = None) -> plan.RankStream:
        """This rank's samples still to come in the epoch of ``progress`` (default: its own),
        generated a chunk at a time: the stream ``build_dataloader``'s loader reads."""
        return rank_stream(self.source, self.layout, progress or self.progress)

    def rank_order(self, progress: Progress | None = None) -> np.ndarray:
        """:meth:`rank_stream` in one array (for inspection; iteration never builds it)."""
        return self.rank_stream(progress).materialise()

    def worker_pieces(self) -> Iterator[np.ndarray]:
        """This worker's samples: whole batches of the rank's stream, round-robin over the
        workers, in pieces of about ``plan.STREAM_CHUNK`` samples (memory stays one piece,
        whatever the epoch's length)."""
        worker, workers = _worker()
        held: list[np.ndarray] = []
        count = 0
        for k, batch in enumerate(self.rank_stream().batches()):
            if k % workers != worker:
                continue
            held.append(batch)
            count += len(batch)
            if count >= plan.STREAM_CHUNK:
                yield np.concatenate(held)
                held, count = [], 0
        if held:
            yield np.concatenate(held)

    def windows(self, samples: np.ndarray) -> Windows:
        return self.source.windows(samples)

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # Not a generator function: the progress is reset (or the resume point taken) when the
        # iterator is made, which is when StatefulDataLoader reads a worker's first state.
        worker, workers = _worker()
        self._rank_world()  # refuses now, not at the first sample, in a job without a group
        skip, self._resume_skip = self._resume_skip, None
        if skip is None:
            skip = 0
            epoch = self._pass_epoch(workers)
            if epoch != self.progress.epoch:
                self.progress = Progress(epoch)
        self._started = self.progress
        self._yielded = skip
        self._whole = False
        return self._items(self.worker_pieces(), skip, worker, self.progress.epoch)

    def _items(self, pieces: Iterator[np.ndarray], skip: int, worker: int, epoch: int
               ) -> Iterator[dict[str, torch.Tensor]]:
        """One item per sample, after the first ``skip`` (already yielded before a resume);
        at the end, this worker's slot records ``epoch`` as read whole."""
        yield from self._samples(pieces, skip)
        self._whole = True
        if worker < PASS_SLOTS:
            self._passes[worker] = epoch

    def _samples(self, pieces: Iterator[np.ndarray], skip: int
                 ) -> Iterator[dict[str, torch.Tensor]]:
        for piece in pieces:
            if skip >= len(piece):
                skip -= len(piece)
                continue
            piece, skip = piece[skip:], 0
            windows = iter(self.windows(piece))
            try:
                for sample, window in zip(piece.tolist(), windows, strict=True):
                    batch = make_batch(self.format, np.array([sample]), [window])
                    self._yielded += 1  # before the yield: a state after it counts it
                    yield {k: v[0] for k, v in batch.items()}
            finally:
                windows.close()  # stops the read-ahead now

    # -- Stateful (torchdata) ----------------------------------------------------------------

    def plan_identity(self) -> dict[str, Any]:
        return {**self.source.plan_identity(self.layout.lanes), "lanes": self.layout.lanes}

    def _worker_layout(self) -> dict[str, int]:
        worker, workers = _worker()
        return {"rank": self.rank, "world_size": self.world_size, "batch_size": self.batch_size,
                "per_lane": self.layout.per_lane, "worker": worker, "num_workers": workers}

    def state_dict(self) -> dict[str, Any]:
        """This worker's place in the epoch: a few integers, whatever the position."""
        state = make_state(self._started or self.progress, self.plan_identity())
        state.update(layout=self._worker_layout(), yielded=self._yielded)
        if self._whole:
            state["whole"] = True  # the next pass reads the next epoch
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``__iter__`` continue after the samples ``state`` had yielded (on
        the plan it was taken on where this dataset's settings left a choice open)."""
        source, progress = resume_on_saved_plan(self.source, state, self.layout.lanes)
        saved, mine = state.get("layout"), self._worker_layout()
        if saved != mine:
            raise LoaderStateError(
                f"worker state saved with layout {saved}, now {mine}: a StatefulDataLoader "
                "resumes on the same rank, world size, batch_size and num_workers (the "
                "build_dataloader loader's state resumes across them)")
        self.source, self.progress = source, progress
        self._started, self._yielded, self._whole = None, 0, False
        if state.get("whole"):  # taken after a whole pass: the next pass moves on
            if mine["worker"] < PASS_SLOTS:
                self._passes[mine["worker"]] = progress.epoch
            self._resume_skip = None
        else:
            self._resume_skip = int(state["yielded"])
