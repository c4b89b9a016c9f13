"""Data-wait and throughput accounting (pure), the JSON-lines log, and the plot subcommand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.cli import main as cli_main
from trainer.metrics import (
    IntervalMeter,
    JsonlWriter,
    RunTotals,
    format_record,
    format_summary,
    read_jsonl,
)


def test_interval_meter_fractions_and_rates() -> None:
    m = IntervalMeter()
    # Three steps of 0.5 s; 0.1 s, 0.0 s and 0.2 s of that spent blocked on data.
    for wait in (0.1, 0.0, 0.2):
        m.add_wait(wait)
        m.add_step(0.5, tokens=1000)
    s = m.flush()
    assert s.steps == 3
    assert s.seconds == pytest.approx(1.5)
    assert s.data_wait_frac == pytest.approx(0.3 / 1.5)
    assert s.tokens_per_s == pytest.approx(3000 / 1.5)
    assert s.step_time == pytest.approx(0.5)


def test_flush_starts_a_fresh_interval() -> None:
    m = IntervalMeter()
    m.add_wait(1.0)
    m.add_step(2.0, tokens=10)
    m.flush()
    m.add_step(1.0, tokens=5)
    s = m.flush()
    assert (s.steps, s.seconds, s.wait_seconds, s.tokens) == (1, 1.0, 0.0, 5)
    assert s.data_wait_frac == 0.0


def test_empty_interval_has_no_division_by_zero() -> None:
    s = IntervalMeter().flush()
    assert (s.data_wait_frac, s.tokens_per_s, s.step_time) == (0.0, 0.0, 0.0)


def test_negative_durations_are_rejected() -> None:
    m = IntervalMeter()
    with pytest.raises(ValueError):
        m.add_wait(-0.1)
    with pytest.raises(ValueError):
        m.add_step(-1.0, tokens=1)


def test_run_totals_weigh_intervals_by_time_not_count() -> None:
    m, totals = IntervalMeter(), RunTotals()
    m.add_wait(0.9)
    m.add_step(1.0, tokens=100)  # a slow, data-starved interval
    totals.add(m.flush(), loss=5.0)
    for _ in range(9):
        m.add_step(1.0, tokens=100)  # then nine seconds without waiting
    totals.add(m.flush(), loss=4.0, data_wait_frac=0.1)  # e.g. the mean over ranks
    s = totals.summary()
    assert s["steps"] == 10
    assert s["final_loss"] == 4.0
    assert s["mean_tokens_per_s"] == pytest.approx(1000 / 10.0)
    assert s["mean_data_wait_pct"] == pytest.approx(100 * (0.9 + 0.9) / 10.0)
    assert "final loss 4.0000" in format_summary(s)


def record(step: int, loss: float, wait: float) -> dict:
    return {"step": step, "total_steps": 30, "loss": loss, "lr": 1e-3, "tokens_per_s": 500.0,
            "step_time_s": 0.25, "data_wait_frac": wait, "data_wait_frac_max": wait * 1.5,
            "epoch": 0, "grad_norm": 1.0}


def test_jsonl_round_trip_and_line_format(tmp_path: Path) -> None:
    with JsonlWriter(tmp_path / "m.jsonl") as w:
        w.write(record(5, 3.5, 0.1))
        w.write(record(10, 3.0, 0.05))
    rows = read_jsonl(tmp_path / "m.jsonl")
    assert [r["step"] for r in rows] == [5, 10]
    line = format_record(rows[0])
    assert "loss 3.5000" in line and "data-wait 10.0%" in line and "tok/s 500" in line


def test_plot_subcommand_writes_a_png(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(record(s, 5.0 - s / 10, 0.02 * s)) + "\n" for s in range(5, 35, 5)))
    assert cli_main(["plot", str(tmp_path)]) == 0
    png = (tmp_path / "metrics.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 10_000  # three panels with data, not an empty canvas


@pytest.mark.parametrize("argv", [["plot"], ["plot", "a", "b"], ["plot", "a", "--width", "3"]])
def test_plot_flags_go_through_the_config_mechanism(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A missing RUN_DIR, an extra argument, an unknown flag: one ``error:`` line, rc 2."""
    with pytest.raises(SystemExit) as caught:
        cli_main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_plot_help_names_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plot", "--help"]) == 0
    assert "RUN_DIR" in capsys.readouterr().out


def test_plot_of_an_empty_log_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="no records"):
        cli_main(["plot", str(tmp_path)])


def test_mfu_from_peak_and_flops() -> None:
    from trainer.metrics import mfu, peak_flops

    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA GH200 480GB") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert peak_flops("cpu") is None and peak_flops(None) is None
    # GPT-2 small (~124M params -> ~0.75 GFLOP/token) at 400k tok/s on one H100 ~ 30 %.
    assert mfu(400e3, 6 * 124e6, 1, 989e12) == pytest.approx(0.301, abs=1e-3)
    assert mfu(8 * 400e3, 6 * 124e6, 8, 989e12) == pytest.approx(0.301, abs=1e-3)
    assert mfu(1.0, 1.0, 1, None) is None
