"""The trainer's energy figures: per logging interval in metrics.jsonl, in the summary and
the plot, from the real path of this machine (RAPL where readable, else a labelled estimate)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import torch

from infra.energy.meter import J_PER_KWH
from infra.energy.rapl import find_zones
from trainer.metrics import RunTotals, energy_fields, nvml_index, read_jsonl
from trainer.train import train

from .test_loop import SINGLE, config


def test_energy_fields_and_totals() -> None:
    rec = energy_fields(120.0, "estimate", steps=4, tokens=1200, g_per_kwh=400.0)
    assert rec["energy_j_per_step"] == 30.0 and rec["energy_j_per_token"] == 0.1
    assert rec["gco2e"] == pytest.approx(120.0 / J_PER_KWH * 400.0)
    assert "gco2e" not in energy_fields(1.0, "rapl", 1, 1)
    totals = RunTotals(tokens=2400)
    totals.add_energy(rec)
    totals.add_energy({**rec, "energy_source": "rapl"})
    s = totals.summary()
    assert s["energy_j"] == 240.0 and s["energy_source"] == "estimate"  # mixed: an estimate
    assert s["energy_j_per_token"] == 0.1


def test_nvml_index_follows_cuda_visible_devices() -> None:
    assert nvml_index(1, "3,5") == 5 and nvml_index(0, "") == 0
    assert nvml_index(0, "GPU-8a1f") == 0  # UUIDs: CUDA's own index


def test_training_logs_energy_per_step_and_token(tmp_path: Path, synthetic_loader) -> None:
    loader = synthetic_loader(vocab_size=32, batch_size=8, seq_len=16, batches_per_epoch=3)
    cfg = config(tmp_path, steps=4, log_every=2, grid_intensity=300.0)
    summary = train(cfg, SINGLE, loader, 32, tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    expected = "rapl" if find_zones() else "estimate"
    for r in records:
        assert r["energy_source"] == expected and r["energy_j"] > 0
        assert r["energy_j_per_step"] == pytest.approx(r["energy_j"] / r["interval_steps"])
        assert r["energy_j_per_token"] == pytest.approx(r["energy_j"] / r["tokens"])
        assert r["gco2e"] == pytest.approx(r["energy_j"] / J_PER_KWH * 300.0)
    assert summary["energy_j"] == pytest.approx(sum(r["energy_j"] for r in records))
    assert summary["energy_source"] == expected and summary["gco2e"] > 0

    pytest.importorskip("matplotlib")
    from trainer.plot import plot_run

    png = plot_run(tmp_path)
    assert png.stat().st_size > 0


def test_a_second_rank_on_a_measured_host_adds_no_estimate() -> None:
    from trainer.metrics import StepEnergy

    meter = StepEnergy(local_rank=1)
    end = torch.randn(200, 200)
    # CPU time is read in clock ticks (10 ms): work until several have passed, or an
    # interval that read 0 CPU-s would pass for "no estimate" (it did, on a loaded machine)
    me = psutil.Process()
    start = sum(me.cpu_times()[:2])
    while sum(me.cpu_times()[:2]) - start < 0.05:
        end = end @ end.T / 200
    e = meter.interval()
    assert e.cpu_s > 0
    assert e.rapl_j == 0  # the host's counters are read by its local rank 0 only
    assert (e.estimate_j == 0) == bool(find_zones())
