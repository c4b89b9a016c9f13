"""The optimizer: AdamW with weight decay on matrices only.

Biases and LayerNorm gains are left undecayed (decaying them only pulls scales towards 0
without regularising anything useful); embeddings and linear weights are decayed.
"""

from __future__ import annotations

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into a decayed (dim >= 2) and a non-decayed group."""
    decay, no_decay = [], []
    for p in model.parameters():  # de-duplicates tied parameters
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW; the fused CUDA kernel when every parameter is on CUDA (fewer launches)."""
    groups = param_groups(model, weight_decay)
    on_cuda = all(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=on_cuda or None)
