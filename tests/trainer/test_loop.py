"""The training loop in one process, on the synthetic stand-in loader (no data stack)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainer.config import TrainConfig, resolve
from trainer.distributed import DistInfo
from trainer.metrics import read_jsonl
from trainer.train import check_batch, default_run_dir, train

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def config(run_dir: Path, **overrides: object) -> TrainConfig:
    base = dict(data="synthetic://", steps=22, batch_size=8, seq_len=16, layers=2, width=64,
                heads=2, lr=1e-2, warmup_steps=2, log_every=5, run_dir=str(run_dir),
                num_workers=0, device="cpu")
    base.update(overrides)
    return resolve(TrainConfig(**base), "cpu", bf16_supported=False)  # type: ignore[arg-type]


def test_loop_learns_logs_and_rolls_over_epochs(tmp_path: Path, synthetic_loader) -> None:
    loader = synthetic_loader(vocab_size=32, batch_size=8, seq_len=16, batches_per_epoch=3)
    summary = train(config(tmp_path), SINGLE, loader, 32, tmp_path)

    # 22 steps over 3-batch epochs: epochs 0..7 were started, each by set_epoch, in order.
    assert loader.epochs_set == list(range(8))

    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [5, 10, 15, 20, 22]  # every K and the last step
    assert [r["interval_steps"] for r in records] == [5, 5, 5, 5, 2]
    assert records[-1]["loss"] < 0.5 * records[0]["loss"], records
    for r in records:
        assert 0.0 <= r["data_wait_frac"] <= 1.0
        assert r["tokens_per_s"] > 0
        assert r["tokens"] == r["interval_steps"] * 8 * 16
    assert records[-1]["epoch"] == 7

    samples = read_jsonl(tmp_path / "rank0_samples.jsonl")
    assert [s["step"] for s in samples] == list(range(1, 23))
    assert [s["epoch"] for s in samples] == [(s - 1) // 3 for s in range(1, 23)]
    assert all(len(s["rows"]) == 8 for s in samples)

    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["world_size"] == 1 and cfg["model"]["vocab_size"] == 32
    assert cfg["train"]["steps"] == 22 and cfg["train"]["dtype"] == "float32"
    assert json.loads((tmp_path / "summary.json").read_text()) == pytest.approx(summary)
    assert summary["steps"] == 22
    assert summary["final_loss"] == records[-1]["loss"]


def test_data_wait_measures_time_blocked_on_the_loader(tmp_path: Path, synthetic_loader) -> None:
    delay = 0.1

    def intervals(delay_s: float, run_dir: Path) -> list[dict]:
        loader = synthetic_loader(vocab_size=32, batch_size=2, seq_len=8, batches_per_epoch=4,
                                  delay_s=delay_s)
        cfg = config(run_dir, steps=12, batch_size=2, seq_len=8, log_every=4)
        train(cfg, SINGLE, loader, 32, run_dir)
        return read_jsonl(run_dir / "metrics.jsonl")

    slow = intervals(delay, tmp_path / "slow")
    fast = intervals(0.0, tmp_path / "fast")
    # Bounds that hold however loaded the machine is (two shared cores): the loader's sleep
    # is a floor for the measured wait, and the wait is part of the step time.
    for r in slow:
        assert r["interval_steps"] * delay <= r["interval_wait_s"] <= r["interval_s"], r
        assert r["data_wait_frac"] == r["interval_wait_s"] / r["interval_s"]
    for r in fast:
        assert r["interval_wait_s"] < r["interval_steps"] * delay / 2, r
    assert all(s["data_wait_frac"] > f["data_wait_frac"] for s, f in zip(slow, fast, strict=True))


def test_a_loader_without_batches_is_an_error(tmp_path: Path, synthetic_loader) -> None:
    loader = synthetic_loader(batches_per_epoch=0)
    with pytest.raises(ValueError, match="no batches"):
        train(config(tmp_path), SINGLE, loader, 32, tmp_path)


def test_batches_the_model_cannot_take_fail_readably() -> None:
    ids = torch.tensor([[1, 2, 40]])
    with pytest.raises(ValueError, match="vocab_size"):
        check_batch(ids, ids, vocab_size=32, seq_len=3)
    with pytest.raises(ValueError, match="not 4"):
        check_batch(ids, ids, vocab_size=64, seq_len=4)
    check_batch(ids, ids, vocab_size=64, seq_len=3)


def test_default_run_dir_does_not_reuse_an_existing_one(tmp_path: Path) -> None:
    from datetime import datetime

    now = datetime(2025, 1, 2, 3, 4, 5)
    first = default_run_dir(now, base=str(tmp_path))
    assert first == tmp_path / "20250102-030405"
    first.mkdir()
    assert default_run_dir(now, base=str(tmp_path)) == tmp_path / "20250102-030405-1"
