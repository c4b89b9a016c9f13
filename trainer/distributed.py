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


#: The process group's timeout when hang detection is off: torch's gloo default, stated.
DEFAULT_PG_TIMEOUT_S = 1800.0


def pg_timeout_s(hang_timeout: float, hang_timeout_io: float) -> float:
    """How long a collective may block before the process group itself gives up. With hang
    detection on, a backstop that never fires before the heartbeat would (its longest limit
    plus two minutes); without, torch's gloo default, set explicitly."""
    if hang_timeout <= 0:
        return DEFAULT_PG_TIMEOUT_S
    return max(hang_timeout, hang_timeout_io) + 120.0


def nccl_env(pg_timeout: float) -> dict[str, str]:
    """NCCL's own watchdog settings, set (unless the user set them) where CUDA is used: errors
    tear the process down instead of hanging (async error handling 3 = tear down), the
    watchdog's heartbeat monitor kills a process whose watchdog is stuck for longer than the
    collective timeout plus a minute (its default, 480 s, could fire during a long checkpoint),
    and a timed-out collective dumps the flight recorder's trace of recent collectives."""
    return {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(int(pg_timeout + 60)),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }


def init_distributed(device_preference: str = "auto", *, hang_timeout: float = 0.0,
                     hang_timeout_io: float = 600.0) -> DistInfo:
    """Start the default process group when launched by torchrun; otherwise world size 1.
    ``hang_timeout > 0`` also starts this rank's heartbeat (:mod:`trainer.heartbeat`), which
    :func:`destroy_distributed` stops."""
    from datetime import timedelta

    timeout = pg_timeout_s(hang_timeout, hang_timeout_io)
    if not launched_by_torchrun():
        info = DistInfo(0, 1, 0, pick_device(device_preference, 0), None)
    else:
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = pick_device(device_preference, local_rank)
        store = attempt_store(rank, world_size)
        if device.type == "cuda":
            for key, value in nccl_env(timeout).items():
                os.environ.setdefault(key, value)
            torch.cuda.set_device(device)
            backend = "nccl"
            dist.init_process_group(backend=backend, device_id=device, store=store, rank=rank,
                                    world_size=world_size, timeout=timedelta(seconds=timeout))
        else:
            backend = "gloo"
            dist.init_process_group(backend=backend, store=store, rank=rank,
                                    world_size=world_size, timeout=timedelta(seconds=timeout))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
        info = DistInfo(rank, world_size, local_rank, device, backend, local_world)
    if hang_timeout > 0:
        start_heartbeat(info, hang_timeout, hang_timeout_io)
    return info


def store_prefix() -> str:
    """The key prefix of this torchrun restart attempt (see :func:`attempt_store`): in the
    agents' long-lived store, one per attempt; in a store of rank 0's (new with every start of
    the workers), none is needed, and none may be used, since the nodes of an elastic job
    count their restarts apart (a node that joins starts at 0)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return "shardflow"
    return f"shardflow/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def attempt_store(rank: int, world_size: int) -> dist.Store:
    """The rendezvous store, with a key prefix per torchrun restart attempt.

    Why: after ``torchrun --max-restarts`` restarts the workers, they may meet in the same
    store as the attempt before. In torch 2.13 the new workers then sometimes read the killed
    workers' gloo addresses (same keys) and fail with "connection refused". A prefix per
    attempt (``TORCHELASTIC_RESTART_COUNT``) keeps every attempt's keys apart.

    The count is per agent and does not change when nodes join or leave, so an elastic job
    (``--nnodes MIN:MAX``) runs its agents with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``:
    then the store is not the agents' long-lived one but a fresh one per rendezvous round,
    hosted by rank 0 (``TORCHELASTIC_USE_AGENT_STORE=False``), on a port its agent picks.
    """
    from datetime import timedelta

    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=not agent_store and rank == 0,
                          timeout=timedelta(minutes=10), multi_tenant=not agent_store)
    return dist.PrefixStore(store_prefix(), store)


def heartbeat_store(timeout_s: float) -> dist.Store:
    """The store the heartbeat talks to: a connection of its own to the rendezvous store
    (under this attempt's prefix), so its sidecar thread never waits behind the process
    group's use of the store, with a short timeout (a frozen store host is a hang too). An
    in-process store without torchrun: the rank then watches itself."""
    from datetime import timedelta

    if not launched_by_torchrun():
        return dist.HashStore()
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                           is_master=False, wait_for_workers=False,
                           timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"{store_prefix()}/heartbeat", client)


def start_heartbeat(info: DistInfo, hang_timeout: float, hang_timeout_io: float) -> None:
    from trainer import heartbeat

    store = heartbeat_store(max(5.0, min(30.0, hang_timeout)))
    hb = heartbeat.Heartbeat(store, info.rank, info.world_size, timeout=hang_timeout,
                             timeout_io=hang_timeout_io)
    heartbeat.install(hb.start())


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy_distributed() -> None:
    from trainer import heartbeat

    hb = heartbeat.current()
    if hb is not None:
        hb.stop()
        heartbeat.install(None)
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
