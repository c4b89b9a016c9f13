"""A carbon signal's numbers are finite and bounded, and its file is read as a regular file,
bounded (infra/energy/signal.py): a NaN intensity crashed the run's gate with an
OverflowError; a FIFO as the signal blocked the run; /dev/zero was read whole."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.energy import SignalError, load_signal
from tests._within import within

#: infra.energy.signal's MAX_INTENSITY and SIGNAL_LIMIT (named here: the code before had none)
MAX_INTENSITY, SIGNAL_LIMIT = 100_000.0, 64 << 20


def _em(value: str) -> str:
    return ('{"zone": "T", "forecast": [{"datetime": "2026-01-01T00:00Z", '
            f'"carbonIntensity": {value}}}]}}')


def _sdk(duration: str) -> str:
    return ('[{"location": "a", "forecastData": [{"timestamp": "2026-01-01T00:00Z", '
            f'"duration": {duration}, "value": 100}}]}}]')


@pytest.mark.parametrize("content, says", [
    (_em("NaN"), "forecast[0].carbonIntensity: expected a non-negative intensity"),
    (_em("Infinity"), "carbonIntensity: expected a non-negative intensity"),
    (_em("1e999"), "carbonIntensity: expected a non-negative intensity"),
    (_em(str(10**400)), "at most 100,000 g/kWh), got a 1329-bit integer"),
    (_sdk("Infinity"), "forecastData[0].duration: expected a duration"),
    (_sdk("NaN"), "forecastData[0].duration: expected a duration"),
    (_sdk("1e300"), "at most a year"),
    (_sdk('"99999999:00:00"'), "forecastData[0].duration: expected a duration"),
    ("[" * 100_000, "not JSON: nested too deeply"),
])
def test_non_finite_and_absurd_numbers_are_errors_naming_the_field(
        tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "signal.json"
    path.write_text(content)
    with pytest.raises(SignalError) as err:
        load_signal(str(path))
    assert str(path) in str(err.value) and says in str(err.value), err.value


def test_the_highest_intensity_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "signal.json"
    path.write_text(_em(str(MAX_INTENSITY)))
    assert [s.g_per_kwh for s in load_signal(str(path))] == [MAX_INTENSITY]


def test_a_fifo_is_refused_at_once_and_a_device_unread(tmp_path: Path) -> None:
    fifo = tmp_path / "signal.json"
    os.mkfifo(fifo)
    got, _ = within(10, load_signal, str(fifo))
    assert isinstance(got, SignalError) and "not a regular file" in str(got), got
    with pytest.raises(SignalError, match="/dev/zero: cannot read .*not a regular file"):
        load_signal("/dev/zero")


def test_a_signal_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "signal.json"
    with open(path, "wb") as fh:
        fh.truncate(SIGNAL_LIMIT + 1)
    with pytest.raises(SignalError, match=f"longer than {SIGNAL_LIMIT:,} bytes"):
        load_signal(str(path))


_PIECES = st.sampled_from([
    '{"zone": "T", "forecast": [', '{"datetime": ', '"2026-01-01T00:00Z"', ', ',
    '"carbonIntensity": ', "NaN", "Infinity", "-1", "1e999", "300", "}", "]", '[{"location": ',
    '"forecastData": [', '"timestamp": ', '"duration": ', '"01:00:00"', '"value": ',
    '"rating": ', '"time": ', '"history": ', "null", "true", '"x"', "{", "["])


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(parts=st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=30))
def test_any_signal_gives_finite_segments_or_a_signal_error(
        tmp_path: Path, parts: list[str]) -> None:
    path = tmp_path / "signal.json"
    path.write_text("".join(parts))
    try:
        segments = load_signal(str(path))
    except SignalError as exc:
        assert str(path) in str(exc)
        return
    for s in segments:
        assert math.isfinite(s.start) and math.isfinite(s.end) and s.end > s.start
        assert 0 <= s.g_per_kwh <= MAX_INTENSITY
    json.dumps([s.__dict__ for s in segments])


def test_the_limits_named_here_are_the_modules() -> None:
    from infra.energy import signal

    assert (signal.MAX_INTENSITY, signal.SIGNAL_LIMIT) == (MAX_INTENSITY, SIGNAL_LIMIT)
