"""Carbon signals: both JSON shapes (Carbon Aware SDK, Electricity Maps), bad files, refresh."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from infra.energy import Segment, Signal, SignalError, load_signal, parse_signal

REPO = Path(__file__).resolve().parents[3]
H = 3600.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def test_the_documented_example_is_a_carbon_aware_sdk_forecast() -> None:
    segs = load_signal(str(REPO / "docs" / "carbon-signal-example.json"))
    assert len(segs) == 24 and all(s.end - s.start == H for s in segs)
    assert segs[0].g_per_kwh == 222.3 and min(s.g_per_kwh for s in segs) == 134.1


def test_carbon_aware_sdk_shapes() -> None:
    forecast = [{"location": "westus", "forecastData": [
        {"location": "westus", "timestamp": "2026-01-01T00:05:00Z", "duration": 5, "value": 9},
        {"location": "westus", "timestamp": "2026-01-01T00:00:00Z", "duration": 5,
         "value": 182.5}]}]
    assert parse_signal(forecast) == [Segment(T0, T0 + 300, 182.5),
                                      Segment(T0 + 300, T0 + 600, 9.0)]
    assert parse_signal(forecast[0]) == parse_signal(forecast)  # one forecast, not a list
    history = [{"location": "eastus", "time": "2026-01-01T00:00:00+00:00",
                "duration": "01:00:00", "rating": 300},
               {"location": "eastus", "time": "2026-01-01T01:00:00Z",
                "duration": "1.00:00:00", "rating": 200}]
    assert parse_signal(history) == [Segment(T0, T0 + H, 300.0),
                                     Segment(T0 + H, T0 + 25 * H, 200.0)]


def test_electricity_maps_shapes() -> None:
    fc = {"zone": "DE", "updatedAt": "2026-01-01T00:00:00Z", "forecast": [
        {"carbonIntensity": 326, "datetime": "2026-01-01T00:00:00.000Z"},
        {"carbonIntensity": 310, "datetime": "2026-01-01T01:00:00.000Z"},
        {"carbonIntensity": 290, "datetime": "2026-01-01T02:00:00.000Z"}]}
    # each point lasts until the next; the last as long as the one before it
    assert parse_signal(fc) == [Segment(T0, T0 + H, 326.0), Segment(T0 + H, T0 + 2 * H, 310.0),
                                Segment(T0 + 2 * H, T0 + 3 * H, 290.0)]
    hist = {"zone": "DE", "history": fc["forecast"][:1]}
    assert parse_signal(hist) == [Segment(T0, T0 + H, 326.0)]  # alone: one hour
    latest = {"zone": "DE", "carbonIntensity": 99, "datetime": "2026-01-01T00:00:00Z"}
    assert parse_signal(latest) == [Segment(T0, T0 + H, 99.0)]


@pytest.mark.parametrize(("content", "says"), [
    ("{not json", "not JSON"),
    ('{"zone": "DE"}', "not a Carbon Aware SDK forecast"),
    ('{"zone": "DE", "forecast": []}', "holds no intensity values"),
    ('{"forecast": [{"datetime": "yesterday", "carbonIntensity": 1}]}',
     "forecast[0].datetime: not an ISO 8601 time"),
    ('{"forecast": [{"datetime": "2026-01-01T00:00Z", "carbonIntensity": -3}]}',
     "forecast[0].carbonIntensity: expected a non-negative intensity"),
    ('[{"location": "a", "forecastData": [{"timestamp": "2026-01-01T00:00Z", "value": 1}]}]',
     "forecastData[0].duration: expected a duration"),
    ('[{"location": "a", "time": "2026-01-01T00:00Z", "duration": 5, "rating": 1},'
     ' {"location": "b", "time": "2026-01-01T00:00Z", "duration": 5, "rating": 1}]',
     "several locations (a, b)"),
    ('[{"what": 1}]', "neither a forecast"),
])
def test_bad_signals_name_the_file(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "signal.json"
    path.write_text(content)
    with pytest.raises(SignalError) as err:
        load_signal(str(path))
    assert str(path) in str(err.value) and says in str(err.value)


def test_a_missing_file_names_itself(tmp_path: Path) -> None:
    with pytest.raises(SignalError, match=f"{tmp_path}/nope.json: cannot read"):
        load_signal(str(tmp_path / "nope.json"))


def test_signal_refreshes_when_the_file_changes_and_keeps_the_last_good_one(
        tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"carbonIntensity": 100, "datetime": "2026-01-01T00:00:00Z"}))
    now = [0.0]
    warnings: list[str] = []
    sig = Signal(f"file://{path}", clock=lambda: now[0], warn=warnings.append)
    assert sig.forecast()[0].g_per_kwh == 100.0
    path.write_text(json.dumps({"carbonIntensity": 50, "datetime": "2026-01-01T00:00:00Z"}))
    os.utime(path, ns=(1, 1))  # a new mtime, whatever the file system's resolution
    assert sig.forecast()[0].g_per_kwh == 100.0  # checked at most once a second
    now[0] = 1.5
    assert sig.forecast()[0].g_per_kwh == 50.0
    path.write_text("{broken")
    os.utime(path, ns=(2, 2))
    now[0] = 3.0
    assert sig.forecast()[0].g_per_kwh == 50.0
    assert len(warnings) == 1 and "keeping the last forecast" in warnings[0]
    assert str(path) in warnings[0]
