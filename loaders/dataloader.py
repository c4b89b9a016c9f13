"""``build_dataloader``: this rank's batches of the plan, with exact and elastic resume.

The plan (:mod:`loaders.plan`) fixes every *global* batch for a global batch size: the same
set of samples, in the same order, on any world size and any ``num_workers`` that divide it.
This rank's batch is its lanes' part of the global batch; with gradient accumulation
(``global_batch_size`` > ``batch_size x world_size``), consecutive batches split that part.

Two ways to run, same batches in the same order:

- ``num_workers=0`` (default): row groups are fetched, verified and decoded ahead by a small
  I/O thread pool (reading and decompressing release the GIL); each batch is cut from them on
  the caller's thread when it asks. ``batch_thread=True``, which the trainer uses, also
  builds up to ``prefetch_factor`` batches ahead on a background thread while the caller is
  busy, and the caller still builds the next one itself when none is ready.
- ``num_workers>0``: a ``torch.utils.data.DataLoader`` whose workers each own a contiguous
  run of the rank's lanes: each produces its lanes' part of every batch, reading and
  decoding only its own row groups (bar a block cut by a lane boundary), and the main
  process concatenates the parts in worker order, which is the batch's order. At most one
  worker per lane (more are not started). A worker sends its parts of 8 batches at a time
  as one int32 tensor of raw windows; the int64 inputs and labels are built here, as in the
  in-process path (a hand-off between processes costs per item far more than a batch does).

``state_dict()`` is the :class:`loaders.plan.Progress` value plus the plan's identity (a
handful of integers); ``load_state_dict()`` continues the exact sequence, also on another
``num_workers``, world size or per-rank batch size (at a global batch boundary).

Epochs and ranks (:mod:`loaders.position`): iterating again after a whole epoch reads the
next one (``set_epoch`` chooses another), and a loader not given ``rank``/``world_size``
takes them from the process group at its first iteration, so it may be built before the
group exists (a Lightning script's top level, before accelerate's ``Accelerator()``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loaders import plan
from loaders.batches import BatchFormat, batches, batches_from_chunks, window_chunks
from loaders.dataset import open_source
from loaders.plan import Layout, Progress
from loaders.position import Position
from loaders.settings import LoaderSettings
from loaders.source import Source, rank_stream
from loaders.state import STATE_VERSION, LoaderStateError
from loaders.world import LayoutSpec, WorldNotReadyError

_log = logging.getLogger(__name__)

__all__ = ["STATE_VERSION", "LoaderStateError", "ShardflowLoader", "WorldNotReadyError",
           "build_dataloader"]

#: A stream of batches: a generator, so closing it stops the read-ahead behind it.
Batches = Generator[dict[str, torch.Tensor], None, None]
#: Batches whose parts a DataLoader worker sends as one item (one int32 tensor of windows).
CHUNK_BATCHES = 8
#: In-process, the rank's sequence is generated and read ahead this many samples (whole
#: batches) at a time (:func:`loaders.source.rank_stream`), so neither the plan nor the
#: read-ahead schedule grows with the rank's share of the epoch. A row group used on both
#: sides of a piece boundary is read once per piece (a few per piece at the default size).
STREAM_SAMPLES = plan.STREAM_CHUNK


class _WorkerParts(IterableDataset):
    """In DataLoader worker ``w``: its lanes' part of each of the rank's batches, in order."""

    def __init__(self, source: Source, layout: Layout, progress: Progress, fmt: BatchFormat,
                 num_workers: int) -> None:
        super().__init__()
        self.source, self.layout, self.progress = source, layout, progress
        self.format, self.num_workers = fmt, num_workers

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker = info.id if info else 0
        layout, progress = self.layout, self.progress
        lanes = layout.lanes_per_rank
        m = self.source.lane_length(layout.lanes)
        lo, _hi = layout.rank_lanes()
        wlo, whi = plan.worker_lanes(lanes, self.num_workers)[worker]
        block = np.zeros((lanes, m), dtype=np.int64)  # only this worker's lanes are read
        block[wlo:whi] = self.source.lane_samples(progress.epoch, layout.lanes, lo + wlo,
                                                  lo + whi)
        positions, counts = plan.worker_parts(lanes, m, layout, progress, worker,
                                              self.num_workers)
        mine = plan.sequence(block, layout, progress)[positions]
        return window_chunks(mine, self.source.windows(mine), counts.tolist(),
                             self.format.seq_len, CHUNK_BATCHES)


class ShardflowLoader:
    """Iterates the batches of one epoch for this rank; iterating again reads the next one.

    Where it stands is a :class:`loaders.position.Position`: the layout, taken from the
    process group at the first iteration when the loader was not given ``rank`` and
    ``world_size`` (so it may be built before the group exists), and the progress, which
    moves to the next epoch when a whole one was read (``set_epoch`` chooses another).

    A ``torch.distributed.checkpoint`` *Stateful* by shape (``state_dict`` and
    ``load_state_dict``): DCP's ``Stateful`` is a runtime-checkable protocol, so matching it
    needs no import of DCP, which would cost every data loop ~0.7 s of start-up.
    """

    def __init__(self, source: Source, layout: Layout | LayoutSpec, *, num_workers: int = 0,
                 pin_memory: bool = False, prefetch_factor: int = 4,
                 batch_thread: bool = False, return_sample_id: bool = False,
                 return_position_ids: bool = False) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        spec = layout if isinstance(layout, LayoutSpec) else LayoutSpec.of(layout)
        self.format = BatchFormat(source.seq_len, source.eos_id, return_sample_id,
                                  return_position_ids)
        if return_position_ids and source.eos_id is None:
            raise ValueError("position_ids need the tokenizer's EOS id; the manifest has none")
        self._pos = Position(source, spec)
        self._workers_asked = num_workers
        self.pin_memory = pin_memory
        self.prefetch_factor = max(1, prefetch_factor)
        self.batch_thread = batch_thread
        self._batches_total = 0
        self._wait_s = 0.0
        self._started = time.perf_counter()
        self._advised: tuple[int, int] | None = None
        with contextlib.suppress(WorldNotReadyError):  # else at the first iteration
            self._advise(self._pos.layout())

    def _advise(self, layout: Layout) -> None:
        """Warn, once per layout, when the read-ahead cannot hold a run per lane."""
        advice = getattr(self.source, "readahead_advice", None)
        key = (layout.lanes_per_rank, layout.lanes)
        if advice is None or key == self._advised:
            return
        self._advised = key
        per_reader = -(-layout.lanes_per_rank // max(1, self._workers(layout)))
        message = advice(per_reader, layout.lanes)
        if message:
            _log.warning(message)

    def _workers(self, layout: Layout) -> int:
        return min(self._workers_asked, layout.lanes_per_rank)

    @property
    def source(self) -> Source:
        return self._pos.source

    @property
    def layout(self) -> Layout:
        """This rank's layout (taken from the process group now if not yet)."""
        return self._pos.layout()

    @property
    def num_workers(self) -> int:
        """Worker processes an iteration starts: one per lane of this rank at most."""
        current = self._pos.current
        return self._workers(current) if current is not None else self._workers_asked

    @property
    def progress(self) -> Progress:
        """Where this rank's epoch stands, batches handed out so far included."""
        return self._pos.progress

    @progress.setter
    def progress(self, value: Progress) -> None:
        self._pos.progress = value

    @property
    def batch_size(self) -> int:
        return self._pos.spec.batch_size

    @property
    def dataset(self) -> Source:
        """The source (the attribute's old name, kept for existing callers)."""
        return self.source

    # -- epochs and length -------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    def set_epoch(self, epoch: int) -> None:
        """The next iteration reads ``epoch`` (call on every rank): from its start, except
        the epoch read in part now, which continues (a finished one starts again)."""
        self._pos.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches in a whole epoch on this rank; equal on every rank."""
        return self._pos.epoch_batches()

    def remaining(self) -> int:
        """Batches still to come in the current epoch on this rank."""
        return self._pos.remaining()

    # -- state (torch.distributed.checkpoint Stateful) ---------------------------------

    def plan_identity(self) -> dict[str, Any]:
        return self._pos.plan_identity(self.layout)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: small, JSON-serialisable, the same on every rank."""
        return self._pos.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue where ``state_dict`` was taken: on its plan where this loader's settings
        left a choice open (``run_blocks`` unset takes the state's, so a job started before
        the default changed resumes its own order); any other difference is refused. Loaded
        before the process group exists (``WORLD_SIZE`` > 1), it is checked once it does."""
        self._pos.load_state_dict(state_dict)

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        layout, progress = self._pos.start_pass()
        self._advise(layout)
        workers = self._workers(layout)
        if workers == 0:
            build = self._in_process(layout, progress)
            if self.batch_thread:
                build = self._threaded(build)
            return self._count(build)
        parts = _WorkerParts(self.source, layout, progress, self.format, workers)
        loader = DataLoader(parts, batch_size=None, num_workers=workers,
                            prefetch_factor=self.prefetch_factor, persistent_workers=False)
        return self._count(self._assemble(iter(loader), workers,
                                          plan.rank_batches(self._pos.lane_len, layout,
                                                            progress)))

    def _pieces(self, layout: Layout, progress: Progress
                ) -> Iterator[tuple[np.ndarray, list[int]]]:
        """``(samples, batch sizes)``: the rest of this rank's epoch, whole batches a piece."""
        stream = rank_stream(self.source, layout, progress)
        return plan.batch_pieces(stream.chunks(), layout.batch, STREAM_SAMPLES)

    def _in_process(self, layout: Layout, progress: Progress) -> Batches:
        for samples, sizes in self._pieces(layout, progress):
            yield from batches(self.format, samples, self.source.windows(samples), sizes)

    def _assemble(self, chunks: Iterator[dict[str, torch.Tensor]], workers: int,
                  n_batches: int) -> Batches:
        """Batches from the workers' chunks: the DataLoader hands them round-robin."""
        for _ in range(-(-n_batches // CHUNK_BATCHES)):
            yield from batches_from_chunks(self.format,
                                           [next(chunks) for _ in range(workers)])

    def _count(self, source: Batches) -> Batches:
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(source)
                except StopIteration:
                    return
                self._wait_s += time.perf_counter() - t0
                if self.pin_memory:
                    batch = {k: v.pin_memory() for k, v in batch.items()}
                self._pos.handed += batch["input_ids"].shape[0]  # folded when read
                self._batches_total += 1
                yield batch
        finally:
            source.close()

    def _threaded(self, batches_: Batches) -> Batches:
        """Batches built ahead by a background thread, and by the caller when none is ready.

        While the trainer is busy (a GPU step, a sleep), the thread fills up to
        ``prefetch_factor`` batches, so the next one is waiting. When the caller finds none
        ready it builds the next batch itself instead of blocking on a hand-off: a wake-up
        between threads costs more than building a batch. Production is serialised by one
        lock, so batches come out in order whoever builds them.
        """
        ready: collections.deque[Any] = collections.deque()
        cond = threading.Condition()
        stop = threading.Event()
        done = object()

        def build_next() -> Any:  # called with ``cond`` held
            return next(batches_, done)

        def fill() -> None:
            try:
                while True:
                    with cond:
                        while len(ready) >= self.prefetch_factor and not stop.is_set():
                            cond.wait()
                        if stop.is_set():
                            return
                        item = build_next()
                        ready.append(item)
                    if item is done:
                        return
            except BaseException as exc:  # handed to the caller, in order
                with cond:
                    ready.append(exc)

        thread = threading.Thread(target=fill, name="shardflow-batches", daemon=True)
        thread.start()
        try:
            while True:
                with cond:
                    item = ready.popleft() if ready else build_next()
                    cond.notify()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            with cond:
                cond.notify_all()
            thread.join(timeout=5)
            if not thread.is_alive():
                batches_.close()  # stops the read-ahead now

    # -- metrics -----------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """Read and wait counters of this process (the in-process reader's, when used)."""
        elapsed = time.perf_counter() - self._started
        samples = self._batches_total * self.batch_size
        return {**self.source.metrics(), "wait_s": self._wait_s, "samples": float(samples),
                "samples_per_s": samples / elapsed if elapsed > 0 else 0.0}


def build_dataloader(url: str | Source, batch_size: int, seq_len: int | None = None,
                     num_workers: int = 0, *, rank: int | None = None,
                     world_size: int | None = None, global_batch_size: int | None = None,
                     lanes: int | None = None, pin_memory: bool | None = None,
                     prefetch_factor: int = 4, batch_thread: bool = False,
                     storage_options: dict[str, Any] | None = None,
                     replicas: list[str] | None = None,
                     replica_options: list[dict[str, Any] | None] | None = None,
                     manifest: Any = None, settings: LoaderSettings | None = None,
                     **setting_kwargs: Any) -> ShardflowLoader:
    """A loader of ``{"input_ids": [B, L], "labels": [B, L]}`` batches for this rank.

    ``url`` is a dataset URL or a ready :class:`loaders.source.Source` (e.g. a mixture).
    ``rank``/``world_size`` left out: torch.distributed's, taken at the first iteration (or
    ``len()``/a state if asked first), so the process group may be made after the loader;
    while none exists, a job whose ``WORLD_SIZE`` is above 1 is refused
    (:class:`loaders.world.WorldNotReadyError`) rather than read as rank 0 of 1.
    ``global_batch_size`` (default ``batch_size x world_size``) and ``lanes`` (default: the
    global batch size) fix the plan; world size, ``batch_size`` and ``num_workers`` may
    change at a resume as long as they divide it. ``setting_kwargs`` are
    :class:`loaders.settings.LoaderSettings`' (``seed``, ``shuffle``, ``window_blocks``,
    ``run_blocks``, ``read_threads``, ``lookahead_groups``, ``cache_dir``, ``cache_bytes``,
    ``readahead_bytes``, ``return_sample_id``, ``return_position_ids``). ``batch_thread``
    builds up to ``prefetch_factor`` batches ahead on a background thread while the caller is
    busy.
    """
    layout = LayoutSpec(batch_size, global_batch_size, lanes, rank, world_size)
    settings = LoaderSettings.given(settings, seq_len, setting_kwargs)
    store = {k: v for k, v in (("storage_options", storage_options), ("replicas", replicas),
                               ("replica_options", replica_options), ("manifest", manifest))
             if v is not None}
    source = open_source(url, settings, **store)
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    return ShardflowLoader(source, layout, num_workers=num_workers, pin_memory=pin_memory,
                           prefetch_factor=prefetch_factor, batch_thread=batch_thread,
                           return_sample_id=settings.return_sample_id,
                           return_position_ids=settings.return_position_ids)
