"""Which rank of how many this process is, for a loader that was not told.

A loader is often built before the process group exists: at the top of a Lightning script
(the group comes inside ``Trainer.fit``), before accelerate's ``Accelerator()`` or before
transformers' ``TrainingArguments``. Asking torch.distributed then finds no group, and a
loader that took that answer read as rank 0 of 1 on every process: the same data on every
rank, with nothing to say so. So a loader not given ``rank``/``world_size`` asks when it
needs to know (its first iteration; ``len()`` or a state if asked earlier), from the group
if one exists by then, and refuses when none exists but the launcher's ``WORLD_SIZE``
(torchrun, ``accelerate launch``, Lightning's own launcher) says there are several processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from loaders.plan import Layout


class WorldNotReadyError(RuntimeError):
    """A loader needed its rank before the process group exists, in a job of several."""


def dist_rank_world() -> tuple[int, int]:
    """This process's (rank, world size) in torch.distributed, (0, 1) without a process group:
    the one lookup the loader and the trainer's checkpoints share."""
    return group_rank_world() or (0, 1)


def group_rank_world() -> tuple[int, int] | None:
    """(rank, world size) of the default process group; None while there is none."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


def launcher_world_size() -> int:
    """The ``WORLD_SIZE`` a launcher put in the environment (1 when unset or not a number)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def not_ready_message(what: str, world: int) -> str:
    return (f"WORLD_SIZE={world} but no torch.distributed process group exists yet, so {what} "
            "cannot tell its rank (as rank 0 of 1 every process would read the same data): "
            "iterate it, call len() or load a state only once the group exists (inside "
            "Lightning's Trainer.fit, after accelerate's Accelerator() or transformers' "
            "TrainingArguments, after torch.distributed.init_process_group), or pass rank= "
            "and world_size=")


def rank_world(what: str) -> tuple[int, int]:
    """(rank, world size) from the process group; (0, 1) in a job of one process;
    :class:`WorldNotReadyError` when ``WORLD_SIZE`` says several and no group exists yet."""
    found = group_rank_world()
    if found is not None:
        return found
    world = launcher_world_size()
    if world > 1:
        raise WorldNotReadyError(not_ready_message(what, world))
    return 0, 1


def make_layout(batch_size: int, rank: int, world_size: int, global_batch_size: int | None,
                lanes: int | None) -> Layout:
    """The plan's lanes and this rank's place: ``global_batch_size`` defaults to
    ``batch_size x world_size`` (no accumulation), ``lanes`` to the global batch size."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    total = global_batch_size or batch_size * world_size
    lanes = lanes or total
    if total % lanes:
        raise ValueError(f"the global batch ({total}) is not a multiple of the plan's "
                         f"{lanes} lanes")
    return Layout(lanes, total // lanes, world_size, rank, batch_size)


@dataclass(frozen=True)
class LayoutSpec:
    """What a loader was told about its layout; ``rank``/``world_size`` None: ask late.

    Checked when made against one process (rank 0 of 1): a batch size or global batch that
    no world size could use is refused when the loader is built, not at its first batch
    (any layout valid for some world size is valid for one process)."""

    batch_size: int
    global_batch_size: int | None = None
    lanes: int | None = None
    rank: int | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        if (self.rank is None) != (self.world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if self.rank is not None and self.world_size is not None:
            self.make(self.rank, self.world_size)
        else:
            self.make(0, 1)

    @classmethod
    def of(cls, layout: Layout) -> LayoutSpec:
        """The spec that gives ``layout`` (a loader given a ready layout)."""
        return cls(layout.batch, layout.global_batch, layout.lanes, layout.rank,
                   layout.world_size)

    @property
    def fixed(self) -> bool:
        return self.rank is not None

    def make(self, rank: int, world_size: int) -> Layout:
        return make_layout(self.batch_size, rank, world_size, self.global_batch_size,
                           self.lanes)
