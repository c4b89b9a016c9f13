"""Carbon flags and signals that used to crash a run (pipeline/driver/carbon.py): ``--max-intensity
0`` without ``--deadline`` (an OverflowError formatting the infinite wait), a NaN in the
signal (the same, once a NaN reached the planner), a deadline of 1e400 days."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from infra.energy import Signal
from pipeline.config import PipelineConfig
from pipeline.driver import carbon

REPO = Path(__file__).resolve().parents[3]
T0 = 1_767_225_600.0


def _em(points: list[tuple[float, float]]) -> str:
    return json.dumps({"zone": "TEST", "forecast": [
        {"datetime": datetime.fromtimestamp(t, timezone.utc).isoformat(), "carbonIntensity": g}
        for t, g in points]})


def test_a_threshold_never_met_without_a_deadline_waits_out_the_forecast(
        tmp_path: Path) -> None:
    """The code before: OverflowError: cannot convert float infinity to integer."""
    path = tmp_path / "s.json"
    path.write_text(_em([(T0 - 3600, 300), (T0 + 3600, 200)]))
    now = [T0]
    log = io.StringIO()

    def sleep(s: float) -> None:
        now[0] += s

    gate = carbon.CarbonGate(Signal(str(path), clock=lambda: now[0]), None, 0.0, log,
                             clock=lambda: now[0], sleep=sleep)
    assert gate(True) is True
    assert now[0] == T0 + 3 * 3600  # the last point lasts as long as the one before it
    assert log.getvalue().startswith("carbon: waiting for intensity <= 0 g/kWh until ")
    assert "running again" in log.getvalue()


def test_deadlines_past_any_clock_are_refused() -> None:
    for text in ("1" + "0" * 400 + "d", "99999999d"):
        with pytest.raises(ValueError, match="at most 3,660 days ahead"):
            carbon.parse_deadline(text, T0)
        with pytest.raises(ValueError, match="at most 3,660 days"):
            PipelineConfig(carbon_signal="s.json", deadline=text)
    assert carbon.parse_deadline("3660d", 0.0) == 3660 * 86400


def test_clock_text_of_an_unknown_time_is_words_not_a_crash() -> None:
    assert carbon._clock_text(float("inf"), T0) == "an unknown time"
    assert carbon._clock_text(float("nan"), T0) == "an unknown time"


def test_a_nan_signal_on_the_command_line_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "nan.json"
    path.write_text('{"zone": "T", "forecast": [{"datetime": "2026-01-01T00:00Z", '
                    '"carbonIntensity": NaN}]}')
    (tmp_path / "a.txt").write_text("some text\n")
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(tmp_path / "a.txt"), "--no-progress",
         "-o", str(tmp_path / "ds"), "--carbon-signal", str(path), "--max-intensity", "100",
         "--workers", "1", "--dashboard-address", "127.0.0.1:0"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert f"{path}: forecast[0].carbonIntensity: expected a non-negative intensity" \
        in out.stderr
