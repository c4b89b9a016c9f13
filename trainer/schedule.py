"""Learning-rate schedule: linear warmup, then cosine decay to a floor.

A pure function of the step so it can be tested directly and recomputed exactly after a
resume (the scheduler holds no state worth checkpointing beyond the step count).
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_at(
    step: int,
    *,
    max_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.1,
) -> float:
    """The learning rate for 0-based optimizer ``step``.

    Warmup ramps linearly to ``max_lr`` over ``warmup_steps`` (step 0 already gets
    ``max_lr / warmup_steps``, never 0, so the first update is not wasted); from there a half
    cosine goes down to ``min_lr_ratio * max_lr``, reached at ``total_steps - 1`` and held
    after it.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0 or total_steps <= 0:
        raise ValueError(f"need warmup_steps >= 0 and total_steps > 0 ({warmup_steps=}, "
                         f"{total_steps=})")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    min_lr = max_lr * min_lr_ratio
    decay_steps = total_steps - 1 - warmup_steps
    if decay_steps <= 0:
        return max_lr if step < total_steps else min_lr
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.1,
) -> LambdaLR:
    """Wrap :func:`lr_at` as a ``LambdaLR`` (a multiplier of each group's initial lr), so that
    every param group keeps its own base lr."""

    def factor(step: int) -> float:
        return lr_at(step, max_lr=1.0, warmup_steps=warmup_steps, total_steps=total_steps,
                     min_lr_ratio=min_lr_ratio)

    return LambdaLR(optimizer, factor)
