"""The learning-rate schedule: linear warmup then cosine decay, as a pure function."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trainer.schedule import build_scheduler, lr_at

MAX = 1e-3


def lr(step: int, warmup: int = 10, total: int = 100, ratio: float = 0.1) -> float:
    return lr_at(step, max_lr=MAX, warmup_steps=warmup, total_steps=total, min_lr_ratio=ratio)


def test_warmup_is_linear_and_starts_above_zero() -> None:
    assert lr(0) == pytest.approx(MAX / 10)
    assert lr(4) == pytest.approx(5 * MAX / 10)
    assert lr(9) == pytest.approx(MAX)
    diffs = [lr(s + 1) - lr(s) for s in range(9)]
    assert all(d == pytest.approx(MAX / 10) for d in diffs)


def test_cosine_from_peak_to_floor() -> None:
    assert lr(10) == pytest.approx(MAX)  # first decay step is the peak
    assert lr(99) == pytest.approx(0.1 * MAX)  # last step reaches the floor
    mid = 10 + (99 - 10) / 2
    assert lr_at(int(mid), max_lr=MAX, warmup_steps=10, total_steps=100) == pytest.approx(
        0.1 * MAX + 0.5 * 0.9 * MAX * (1 + math.cos(math.pi * (int(mid) - 10) / 89)))
    decay = [lr(s) for s in range(10, 100)]
    assert all(b <= a for a, b in zip(decay, decay[1:], strict=False))


def test_held_at_floor_after_the_end() -> None:
    assert lr(150) == pytest.approx(0.1 * MAX)


def test_no_warmup_and_all_warmup() -> None:
    assert lr(0, warmup=0) == pytest.approx(MAX)
    assert lr(4, warmup=10, total=5) == pytest.approx(MAX / 2)  # run ends inside warmup
    assert lr(0, warmup=0, total=1) == pytest.approx(MAX)


@pytest.mark.parametrize("kwargs", [
    {"step": -1}, {"warmup_steps": -1}, {"total_steps": 0}, {"min_lr_ratio": 1.5},
])
def test_rejects_bad_arguments(kwargs: dict) -> None:
    args = {"step": 0, "max_lr": MAX, "warmup_steps": 1, "total_steps": 10, **kwargs}
    with pytest.raises(ValueError):
        lr_at(**args)


@given(step=st.integers(0, 10_000), warmup=st.integers(0, 500), total=st.integers(1, 5_000),
       ratio=st.floats(0.0, 1.0))
def test_always_within_floor_and_peak(step: int, warmup: int, total: int, ratio: float) -> None:
    value = lr_at(step, max_lr=MAX, warmup_steps=warmup, total_steps=total, min_lr_ratio=ratio)
    assert 0.0 <= value <= MAX * (1 + 1e-12)
    if step >= warmup:  # decay phase: never below the floor
        assert value >= ratio * MAX * (1 - 1e-12)
    else:  # warmup: strictly positive, so no step is wasted
        assert value > 0.0


def test_scheduler_follows_the_pure_function_per_param_group() -> None:
    w = torch.nn.Parameter(torch.zeros(2))
    b = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [w], "lr": MAX}, {"params": [b], "lr": 2 * MAX}])
    sched = build_scheduler(opt, warmup_steps=3, total_steps=12, min_lr_ratio=0.1)
    for step in range(15):
        expected = lr_at(step, max_lr=MAX, warmup_steps=3, total_steps=12)
        assert opt.param_groups[0]["lr"] == pytest.approx(expected)
        assert opt.param_groups[1]["lr"] == pytest.approx(2 * expected)
        opt.step()
        sched.step()
