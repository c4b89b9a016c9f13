"""Applying data parallelism to a model.

One function per strategy, so the loop only calls :func:`parallelize`:

* ``ddp``  — ``DistributedDataParallel``: full replicas, gradients all-reduced.
* ``fsdp`` — FSDP2 ``fully_shard`` per transformer block (``model.layers``), then the root, over
  a :class:`~torch.distributed.device_mesh.DeviceMesh`. One node: a 1-D mesh, parameters,
  gradients and optimizer state sharded over every rank. Several nodes: a 2-D mesh
  ``(replicate=nodes, shard=ranks per node)`` — HSDP: shard inside a node (fast links), replicate
  across nodes (one all-reduce of shards over the slow network). bf16 on CUDA is FSDP2's
  ``MixedPrecisionPolicy`` (bf16 compute and gathers, fp32 gradient reduction and master
  weights) rather than autocast.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.distributed import DistInfo, is_initialized

STRATEGIES = ("ddp", "fsdp")


def apply_ddp(model: nn.Module, info: DistInfo) -> nn.Module:
    """Wrap in DDP: gradients are all-reduced (averaged) during backward, parameters and
    buffers are broadcast from rank 0 at construction so every rank starts identical."""
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(model, device_ids=device_ids)


def mesh_shape(info: DistInfo) -> tuple[int, ...]:
    """``(world,)`` on one node, ``(nodes, ranks_per_node)`` (HSDP) on several."""
    nodes = info.world_size // max(info.local_world_size, 1)
    if nodes > 1 and nodes * info.local_world_size == info.world_size:
        return (nodes, info.local_world_size)
    return (info.world_size,)


def apply_fsdp(model: nn.Module, info: DistInfo, bf16: bool) -> nn.Module:
    """FSDP2 in place: each block is one all-gather/reduce-scatter unit, so only one block's
    full parameters live at a time; the root covers embeddings, final norm and the (tied)
    head."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    shape = mesh_shape(info)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh(info.device.type, shape, mesh_dim_names=names)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if bf16 else MixedPrecisionPolicy()
    layers = getattr(model, "layers", [])
    for i, block in enumerate(layers):
        # The last block's parameters are needed again at once by backward: keep them.
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(layers) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def parallelize(model: nn.Module, info: DistInfo, strategy: str = "ddp",
                bf16: bool = False) -> nn.Module:
    """Return the module the loop trains. Without a process group the model is unchanged."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown data-parallel strategy {strategy!r} (have: ddp, fsdp)")
    if not is_initialized():
        return model
    if strategy == "ddp":
        return apply_ddp(model, info)
    return apply_fsdp(model, info, bf16)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model under a DDP wrapper (for parameter counts, FLOPs, state dicts)."""
    return model.module if isinstance(model, DDP) else model


def set_gradient_sync(train_model: nn.Module, enabled: bool) -> None:
    """FSDP2: skip the reduce-scatter on gradient-accumulation micro-steps but the last.
    (DDP's equivalent is the ``no_sync()`` context, used by the loop.)"""
    setter = getattr(train_model, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(enabled)
