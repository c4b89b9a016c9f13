"""Carbon-aware admission and the run's energy: the gate on a fake clock, then a real run that
waits for a cleaner window and still meets its deadline."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from infra.energy import Signal
from infra.energy.rapl import find_zones
from pipeline.config import PipelineConfig
from pipeline.driver import carbon
from pipeline.driver.job import run
from storage import read_manifest


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def _em(points: list[tuple[float, float]]) -> str:
    """An Electricity Maps forecast."""
    return json.dumps({"zone": "TEST", "forecast": [
        {"datetime": _iso(t), "carbonIntensity": g} for t, g in points]})


def test_parse_deadline() -> None:
    assert carbon.parse_deadline("24h", 100.0) == 100.0 + 86400
    assert carbon.parse_deadline("90m", 0.0) == 5400 and carbon.parse_deadline("2d", 0.0) == 172800
    assert carbon.parse_deadline("2026-01-01T01:00Z", 0.0) == 1_767_229_200.0
    assert carbon.parse_deadline("2026-01-01T01:00", 0.0) == 1_767_229_200.0  # UTC
    with pytest.raises(ValueError, match="deadline 'soon'"):
        carbon.parse_deadline("soon", 0.0)


def test_config_checks_the_carbon_flags() -> None:
    with pytest.raises(ValueError, match="need --carbon-signal"):
        PipelineConfig(deadline="24h")
    with pytest.raises(ValueError, match="deadline 'tomorrow'"):
        PipelineConfig(carbon_signal="s.json", deadline="tomorrow")
    assert not PipelineConfig().for_manifest().keys() & {"carbon_signal", "deadline",
                                                         "record_energy"}


def test_gate_waits_for_the_cleaner_window_then_admits(tmp_path: Path) -> None:
    t0 = 1_767_225_600.0
    path = tmp_path / "s.json"
    path.write_text(_em([(t0 - 3600, 182), (t0 + 7200, 95), (t0 + 10800, 95)]))
    now = [t0]
    log = io.StringIO()
    sig = Signal(str(path), clock=lambda: now[0])

    def sleep(s: float) -> None:
        now[0] += s

    gate = carbon.CarbonGate(sig, t0 + 86400, None, log, prior_s=600.0,
                             clock=lambda: now[0], sleep=sleep)
    assert gate(False) is False and log.getvalue() == ""  # live tasks: just hold back
    assert gate(True) is True  # nothing live: sleeps until the cleaner window
    assert now[0] == t0 + 7200 and gate.waited_s == 7200
    lines = log.getvalue().splitlines()
    here = datetime.fromtimestamp(t0 + 7200).astimezone()  # the date only if not today
    same_day = here.date() == datetime.fromtimestamp(t0).date()
    until = here.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M")
    assert lines[0] == (f"carbon: waiting for a cleaner window until {until}, 182 g/kWh now, "
                        "95 g/kWh forecast")
    assert lines[-1].startswith("carbon: running again at 95 g/kWh (paused 120.0 min")
    # Threshold mode: over it until the deadline's latest start, then run whatever it is.
    gate = carbon.CarbonGate(sig, now[0] + 3600, 50.0, log, prior_s=0.0,
                             clock=lambda: now[0], sleep=sleep)
    start = now[0]
    assert gate(True) and now[0] == pytest.approx(start + 3600 - carbon.MARGIN_S)


def test_gate_estimates_the_work_left_from_progress(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(_em([(0.0, 100)]))
    now = [1000.0]
    gate = carbon.CarbonGate(Signal(str(path)), None, None, io.StringIO(), prior_s=100.0,
                             clock=lambda: now[0])
    assert gate.need_s() == carbon.need_with_margin(100.0)  # nothing done: the prior
    now[0] += 50.0
    gate.progress = lambda: 0.25  # 50 s for a quarter: 150 s left
    assert gate.need_s() == carbon.need_with_margin(150.0)


def test_run_waits_for_a_cleaner_window_and_meets_its_deadline(tmp_path: Path) -> None:
    """A real run (LocalCluster, one worker) whose signal says the grid is dirty now and for an
    hour: it pauses before its first task. The signal file is then updated (as a forecast
    feed would be) to a cleaner window a second ahead: the run resumes and finishes, long
    before its deadline, with its energy in the summary and the manifest."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.txt").write_text("A short text.\n\nAnother paragraph, cleaner.\n")
    sig = tmp_path / "signal.json"
    now = time.time()
    sig.write_text(_em([(now - 60, 182), (now + 3600, 95), (now + 7200, 95)]))
    log = io.StringIO()
    cfg = PipelineConfig(inputs=[str(inputs / "*.txt")], output=str(tmp_path / "ds"),
                         workers=1, dashboard_address="127.0.0.1:0", carbon_signal=str(sig),
                         deadline="3h", record_energy=True)
    waited: list[float] = []

    def feed() -> None:
        deadline = time.time() + 120
        while "carbon: waiting" not in log.getvalue() and time.time() < deadline:
            time.sleep(0.1)
        t = time.time()
        waited.append(t)
        sig.write_text(_em([(t - 60, 182), (t + 1, 95), (t + 7200, 95)]))

    helper = threading.Thread(target=feed, daemon=True)
    helper.start()
    summary = run(cfg, log=log, progress=False)
    helper.join(5)
    out = log.getvalue()
    # the window opens ~1 h from now: after 23:00 that is tomorrow, and the date is shown
    assert re.search(r"carbon: waiting for a cleaner window until (\d{4}-\d\d-\d\d )?"
                     r"\d\d:\d\d, 182 g/kWh now, 95 g/kWh forecast", out), out
    assert "carbon: running again at 95 g/kWh" in out, out

    energy = summary.energy
    assert energy["waited_s"] > 0.5 and energy["met_deadline"] is True
    expected = "rapl" if find_zones() else "estimate"  # the real path of this machine
    assert energy["source"] == expected and energy["joules"] > 0
    assert energy["joules_per_token"] == pytest.approx(energy["joules"] / summary.tokens, rel=1e-3)
    assert {"phase1", "phase2"} <= set(energy["stages"])
    assert energy["gco2e"] > 0 and 95 <= energy["grid_g_per_kwh"] <= 182
    stats = read_manifest(str(tmp_path / "ds")).stats["energy"]
    assert stats["source"] == expected and stats["joules"] == energy["joules"]
    text = summary.render()
    assert "energy" in text and (expected != "estimate" or "ESTIMATE" in text), text
