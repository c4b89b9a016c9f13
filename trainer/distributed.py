"""Process-group setup and the few collectives the loop needs.

Who owns what: this module owns the choice of device and backend (NCCL only when CUDA is
really there, gloo otherwise) and the lifetime of the default process group. Everything
else asks it for a :class:`DistInfo` and never reads ``RANK``/``LOCAL_RANK`` itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits. ``backend`` is None when no process group was started (a
    plain ``python -m trainer`` run without torchrun)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    local_world_size: int = 1  # ranks on this node (torchrun's LOCAL_WORLD_SIZE)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """torchrun (and any launcher following its env:// contract) sets these variables."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def pick_device(preference: str, local_rank: int) -> torch.device:
    """``auto`` takes CUDA when it is usable, else CPU; ``cuda`` without CUDA is an error
    rather than a silent fallback, because the user asked for it explicitly."""
    if preference not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {preference!r}")
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda was requested but torch.cuda.is_available() is False")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_distributed(device_preference: str = "auto") -> DistInfo:
    """Start the default process group when launched by torchrun; otherwise world size 1."""
    if not launched_by_torchrun():
        return DistInfo(0, 1, 0, pick_device(device_preference, 0), None)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_preference, local_rank)
    store = attempt_store(rank, world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        backend = "nccl"
        dist.init_process_group(backend=backend, device_id=device, store=store, rank=rank,
                                world_size=world_size)
    else:
        backend = "gloo"
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    return DistInfo(rank, world_size, local_rank, device, backend, local_world)


def attempt_store(rank: int, world_size: int) -> dist.Store:
    """The rendezvous store, with a key prefix per torchrun restart attempt.

    Why: after ``torchrun --max-restarts`` restarts the workers, they may meet in the same
    store as the attempt before. In torch 2.13 the new workers then sometimes read the killed
    workers' gloo addresses (same keys) and fail with "connection refused". A prefix per
    attempt (``TORCHELASTIC_RESTART_COUNT``) keeps every attempt's keys apart.
    """
    from datetime import timedelta

    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=not agent_store and rank == 0,
                          timeout=timedelta(minutes=10), multi_tenant=not agent_store)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"shardflow/attempt{attempt}", store)


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy_distributed() -> None:
    if is_initialized():
        dist.destroy_process_group()


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce that is the identity without a process group (world size 1)."""
    if is_initialized():
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
        dist.all_reduce(tensor, op=ops[op])
    return tensor


def broadcast_object(obj: object, src: int = 0) -> object:
    """Rank ``src``'s value on every rank (e.g. a run directory named after a timestamp,
    which would otherwise differ between ranks started a second apart)."""
    if not is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if is_initialized():
        dist.barrier()
