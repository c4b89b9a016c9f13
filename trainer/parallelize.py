"""Applying data parallelism to a model.

One function per strategy, so FSDP2 (``fully_shard`` per ``model.layers`` block) can be
added beside DDP without the loop changing: the loop only calls :func:`parallelize`.
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.distributed import DistInfo, is_initialized


def apply_ddp(model: nn.Module, info: DistInfo) -> nn.Module:
    """Wrap in DDP: gradients are all-reduced (averaged) during backward, parameters and
    buffers are broadcast from rank 0 at construction so every rank starts identical."""
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(model, device_ids=device_ids)


def parallelize(model: nn.Module, info: DistInfo, strategy: str = "ddp") -> nn.Module:
    """Return the module the loop trains. Without a process group the model is unchanged."""
    if not is_initialized():
        return model
    if strategy == "ddp":
        return apply_ddp(model, info)
    raise ValueError(f"unknown data-parallel strategy {strategy!r} (have: ddp)")


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model under a DDP wrapper (for parameter counts, FLOPs, state dicts)."""
    return model.module if isinstance(model, DDP) else model
