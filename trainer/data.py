"""The trainer's side of the data: building the loader and streaming batches across epochs.

Who owns what: ``loaders`` owns the order of samples (seed, epoch, this rank's lanes); this
module only decides *when* an epoch ends and tells the loader the next epoch number via
``set_epoch``. For a later resume, the state to save is the epoch number here plus the
loader's own ``state_dict()`` (a loader that is a ``torch.distributed.checkpoint``
``Stateful``; the real one is).

``loaders``/``storage`` are imported inside the functions that need them so that
``trainer.model``, ``trainer.plot`` and friends stay importable (and testable) without the
data stack; the trainer never imports ``pipeline`` or Dask.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from torch.distributed.checkpoint.stateful import Stateful

if TYPE_CHECKING:
    from trainer.mixture import MixtureFile


class EpochLoader(Protocol):
    """What the loop needs from a loader: iterate one epoch, move to another, know its size."""

    def __iter__(self) -> Iterator[dict[str, Any]]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...


def build_loader(
    url: str | None,
    *,
    batch_size: int,
    seq_len: int,
    num_workers: int,
    seed: int,
    rank: int,
    world_size: int,
    storage_options: dict[str, Any] | None,
    cache_dir: str | None = None,
    cache_bytes: int | None = None,
    readahead_bytes: int | None = None,
    global_batch_size: int | None = None,
    run_blocks: int | None = None,
    mixture: MixtureFile | None = None,
) -> EpochLoader:
    """The real streaming loader for this rank (``loaders.build_dataloader``). Batches carry
    ``sample_id`` so that each rank can log which samples it trained on (a resume is checked
    against that log). ``cache_bytes=None`` / ``readahead_bytes=None`` keep the loaders'
    defaults. ``batch_thread``: the next batches are built while the step runs, so the step
    rarely waits for one.
    ``global_batch_size`` (default ``batch_size x world_size``, i.e. no accumulation) fixes
    the loader's plan: every optimizer step gets the same samples on any world size and
    ``num_workers`` that divide it, also after an elastic resume.
    ``mixture`` (instead of ``url``): the datasets of a ``--mixture`` file, sampled by its
    schedule (``loaders.build_mixture_loader``; component ``i`` plans with ``seed + i``), whose
    steps are global batches: ``global_batch_size`` is needed."""
    from loaders import build_dataloader, build_mixture_loader

    cache: dict[str, Any] = {"cache_dir": cache_dir}
    if cache_bytes is not None:
        cache["cache_bytes"] = cache_bytes
    if readahead_bytes is not None:
        cache["readahead_bytes"] = readahead_bytes
    if mixture is not None:
        return build_mixture_loader(
            list(mixture.urls), batch_size, seq_len, schedule=mixture.schedule, seed=seed,
            num_workers=num_workers, shuffle=True, rank=rank, world_size=world_size,
            storage_options=storage_options, global_batch_size=global_batch_size,
            return_sample_id=True, batch_thread=True, run_blocks=run_blocks, **cache)
    assert url is not None, "a dataset URL or a mixture"
    return build_dataloader(
        url, batch_size, seq_len, num_workers=num_workers, seed=seed, shuffle=True,
        rank=rank, world_size=world_size, storage_options=storage_options,
        global_batch_size=global_batch_size, return_sample_id=True, batch_thread=True,
        run_blocks=run_blocks, **cache,
    )


def dataset_vocab_size(url: str, storage_options: dict[str, Any] | None) -> int:
    """The model's vocabulary comes from the dataset's manifest, never from a flag, so the
    embedding table always matches the token ids in the shards."""
    from storage import read_manifest

    return int(read_manifest(url, storage_options=storage_options).vocab_size)


def mixture_vocab_size(mixture: MixtureFile, storage_options: dict[str, Any] | None) -> int:
    """The vocabulary of a mixture's datasets, which must have been tokenized alike (the same
    tokenizer: their ids mean the same tokens); a ``ConfigError`` naming the file and the two
    components that differ, before anything is trained."""
    from storage import read_manifest
    from trainer.config import ConfigError

    seen: tuple[str, int, str | None] | None = None
    for name, url in zip(mixture.names, mixture.urls, strict=True):
        manifest = read_manifest(url, storage_options=storage_options)
        here = (name, int(manifest.vocab_size), manifest.tokenizer.sha256)
        if seen is not None and here[1:] != seen[1:]:
            raise ConfigError(f"mixture file {mixture.path}: components {seen[0]!r} and "
                              f"{name!r} were tokenized differently (vocab {seen[1]} vs "
                              f"{here[1]}, tokenizer sha256 {str(seen[2])[:12]} vs "
                              f"{str(here[2])[:12]}): their token ids do not mean the same "
                              "thing")
        seen = seen or here
    assert seen is not None
    return seen[1]


class EpochStream:
    """An endless stream of batches over an epoch-based loader.

    When an epoch's iterator is exhausted, the next epoch is started with
    ``set_epoch(epoch + 1)`` (a new order, not a replay). The caller times :meth:`next`, so
    the cost of starting a new epoch's iterator (worker start-up, first reads) counts as
    data wait, which it is.
    """

    def __init__(self, loader: EpochLoader, start_epoch: int = 0) -> None:
        if len(loader) == 0:
            raise ValueError(
                "the loader yields no batches for this rank: the dataset is smaller than one "
                "global batch (batch size x world size x seq len); use a smaller --batch-size "
                "or --seq-len, or more data"
            )
        self.loader = loader
        self.epoch = start_epoch
        self.batches_in_epoch = 0
        self.loader.set_epoch(self.epoch)
        self._it: Iterator[dict[str, Any]] | None = None

    def next(self) -> dict[str, Any]:
        if self._it is None:
            self._it = iter(self.loader)
        try:
            batch = next(self._it)
        except StopIteration:
            if self.batches_in_epoch == 0:
                raise RuntimeError(f"epoch {self.epoch} produced no batches") from None
            self.epoch += 1
            self.batches_in_epoch = 0
            self.loader.set_epoch(self.epoch)
            self._it = iter(self.loader)
            batch = next(self._it)
        self.batches_in_epoch += 1
        return batch

    # -- resume ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The epoch, batches taken in it, and the loader's own state when it has one (the
        same on every rank, so one copy serves all)."""
        state: dict[str, Any] = {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch}
        if isinstance(self.loader, Stateful):
            state["loader"] = self.loader.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where :meth:`state_dict` was taken. A state taken exactly at the end of an
        epoch moves on to the next epoch here: iterating a finished epoch again would replay
        it (that is how torch loaders, and ours, treat a second ``iter``)."""
        self.epoch = int(state["epoch"])
        self.batches_in_epoch = int(state["batches_in_epoch"])
        self._it = None
        self.loader.set_epoch(self.epoch)
        if "loader" in state and isinstance(self.loader, Stateful):
            self.loader.load_state_dict(state["loader"])
        remaining = getattr(self.loader, "remaining", None)
        if remaining is not None and self.batches_in_epoch and remaining() == 0:
            self.epoch += 1
            self.batches_in_epoch = 0
            self.loader.set_epoch(self.epoch)
