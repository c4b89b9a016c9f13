"""A carbon-intensity signal: a forecast read from a file or URL, re-read as a job runs.

Accepted JSON shapes (intensities in gCO2e/kWh):

- the Carbon Aware SDK's ``GET /emissions/forecasts/current`` (a list of forecasts, or one):
  ``[{"location": "westus", "forecastData": [{"timestamp": "2026-12-01T00:00:00Z",
  "duration": 60, "value": 182.0}, ...]}]`` (``duration`` in minutes);
- the Carbon Aware SDK's ``GET /emissions/bylocation`` (measured history):
  ``[{"location": "westus", "time": "...", "duration": "01:00:00", "rating": 182.0}, ...]``;
- Electricity Maps' ``/v3/carbon-intensity/forecast`` (and ``/history``):
  ``{"zone": "DE", "forecast": [{"datetime": "...", "carbonIntensity": 326}, ...]}``; a point
  lasts until the next one (the last one as long as the one before it, one hour when alone);
  and ``/latest``: ``{"zone": "DE", "datetime": "...", "carbonIntensity": 326}``.

An example: docs/carbon-signal-example.json. :func:`parse_signal` is pure; :func:`load_signal`
reads a local path, ``file://`` or any fsspec URL, or ``http(s)://`` (with the header in
``$SHARDFLOW_CARBON_SIGNAL_HEADER``, ``Name: value``, e.g. Electricity Maps' ``auth-token``,
which is never printed); :class:`Signal` re-reads it every ``refresh_s`` and keeps the last good
forecast when a refresh fails. Every error names the source.
"""

from __future__ import annotations

import json
import os
import stat
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from infra import environment
from infra.energy.planner import Segment

HEADER_ENV = "SHARDFLOW_CARBON_SIGNAL_HEADER"
#: a URL is re-read this often while a job runs (a local file: when its mtime changes)
REFRESH_S = 300.0
#: the most of a signal read (a year of 5-minute points is ~10 MB of JSON)
SIGNAL_LIMIT = 64 << 20
#: the highest intensity accepted, g/kWh (the dirtiest grids measure ~1,000-1,500)
MAX_INTENSITY = 100_000.0
#: the longest segment accepted (forecast points are minutes to hours)
MAX_DURATION_S = 366 * 86400.0


class SignalError(ValueError):
    """A carbon signal that cannot be read or understood; the message names its source."""


def _when(value: Any, where: str) -> float:
    if not isinstance(value, str):
        raise SignalError(f"{where}: expected an ISO 8601 time, got {_shown(value)}")
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SignalError(f"{where}: not an ISO 8601 time: {_shown(value)}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def _number(value: Any, where: str) -> float:
    """An intensity: finite, from 0 to :data:`MAX_INTENSITY` (JSON's ``NaN`` and
    ``Infinity`` parse as floats; a NaN compared false with every threshold and reached the
    planner, which crashed with an ``OverflowError``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 <= value <= MAX_INTENSITY):
        raise SignalError(f"{where}: expected a non-negative intensity (at most "
                          f"{MAX_INTENSITY:,.0f} g/kWh), got {_shown(value)}")
    return float(value)


def _shown(value: Any) -> str:
    """A value for an error message: its repr, cut short (a 400-digit number is not
    echoed, and one of 5,000 digits has no repr at all)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _minutes(value: Any, where: str) -> float:
    """The SDK's duration: minutes (forecasts) or "HH:MM:SS" (emissions data); more than 0
    and at most :data:`MAX_DURATION_S` (an infinite one made an endless segment)."""
    total = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        total = float(value) * 60
    elif isinstance(value, str) and len(value) <= 40:
        head, dot, tail = value.partition(".")  # .NET TimeSpan: [D.]HH:MM:SS
        days, rest = (head, tail) if dot and ":" not in head else ("0", value)
        try:
            h, m, s = (float(x) for x in rest.split(":"))
            total = (float(days) * 24 + h) * 3600 + m * 60 + s
        except ValueError:
            pass
    if total is not None and 0 < total <= MAX_DURATION_S:
        return total
    raise SignalError(f"{where}: expected a duration (minutes or HH:MM:SS, at most a year), "
                      f"got {_shown(value)}")


def _points(rows: list[Any], where: str, t_key: str, g_key: str) -> list[Segment]:
    """Electricity Maps' points: each lasts until the next."""
    pts = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise SignalError(f"{where}[{i}]: expected an object")
        pts.append((_when(r.get(t_key), f"{where}[{i}].{t_key}"),
                    _number(r.get(g_key), f"{where}[{i}].{g_key}")))
    pts.sort()
    segs = []
    for i, (t, g) in enumerate(pts):
        # the last point lasts as long as the one before it (one hour when alone)
        end = pts[i + 1][0] if i + 1 < len(pts) else t + (t - pts[i - 1][0] if i else 3600.0)
        if end > t:
            segs.append(Segment(t, end, g))
    return segs


def _sdk(items: list[Any], name: str) -> list[Segment]:
    segs: list[Segment] = []
    locations = set()
    for i, f in enumerate(items):
        where = f"{name}: [{i}]"
        if not isinstance(f, dict):
            raise SignalError(f"{where}: expected an object")
        if "forecastData" in f:
            rows = f["forecastData"]
            if not isinstance(rows, list):
                raise SignalError(f"{where}.forecastData: expected a list")
            locations.add(f.get("location"))
            for j, r in enumerate(rows):
                w = f"{where}.forecastData[{j}]"
                if not isinstance(r, dict):
                    raise SignalError(f"{w}: expected an object")
                start = _when(r.get("timestamp"), f"{w}.timestamp")
                segs.append(Segment(start, start + _minutes(r.get("duration"), f"{w}.duration"),
                                    _number(r.get("value"), f"{w}.value")))
        elif "rating" in f:
            locations.add(f.get("location"))
            start = _when(f.get("time"), f"{where}.time")
            segs.append(Segment(start, start + _minutes(f.get("duration"), f"{where}.duration"),
                                _number(f.get("rating"), f"{where}.rating")))
        else:
            raise SignalError(f"{where}: neither a forecast (forecastData) nor emissions data "
                              "(rating)")
    if len(locations) > 1:
        names = ", ".join(sorted(map(str, locations)))
        raise SignalError(f"{name}: holds several locations ({names}); ask the SDK for one")
    return segs


def parse_signal(data: Any, name: str = "signal") -> list[Segment]:
    """Segments, sorted by start, from one of the accepted shapes; ``name`` goes into errors."""
    if isinstance(data, list):
        segs = _sdk(data, name)
    elif isinstance(data, dict) and ("forecast" in data or "history" in data):
        key = "forecast" if "forecast" in data else "history"
        if not isinstance(data[key], list):
            raise SignalError(f"{name}: {key}: expected a list")
        segs = _points(data[key], f"{name}: {key}", "datetime", "carbonIntensity")
    elif isinstance(data, dict) and "carbonIntensity" in data:
        segs = _points([data], name, "datetime", "carbonIntensity")
    elif isinstance(data, dict) and "forecastData" in data:
        segs = _sdk([data], name)
    else:
        raise SignalError(f"{name}: not a Carbon Aware SDK forecast (a list with "
                          "forecastData) nor an Electricity Maps one (forecast, history or "
                          "carbonIntensity)")
    if not segs:
        raise SignalError(f"{name}: holds no intensity values")
    return sorted(segs, key=lambda s: s.start)


def _fetch(src: str, timeout: float = 30.0) -> bytes:
    if src.startswith(("http://", "https://")):
        req = urllib.request.Request(src, headers={"Accept": "application/json"})
        header = environment.value(HEADER_ENV)
        if ":" in header:
            k, v = header.split(":", 1)
            req.add_header(k.strip(), v.strip())
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - user's URL
            return _bounded(r)
    if "://" in src and not src.startswith("file://"):
        import fsspec

        with fsspec.open(src, "rb") as f:
            return _bounded(f)
    with _open_regular(src.removeprefix("file://")) as f:
        return _bounded(f)


def _open_regular(path: str) -> Any:
    """A local signal file, known to be a regular file: a FIFO is refused without being
    opened (opening it waits for a writer), and opened with ``O_NONBLOCK`` so one swapped in
    after the check cannot block either. (What infra.user_files does for every file a
    user names; energy imports nothing of ours, by the import rules.)"""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file (a FIFO, device or folder)")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file (a FIFO, device or folder)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _bounded(f: Any) -> bytes:
    """All of a signal, at most :data:`SIGNAL_LIMIT` bytes of it (else an error, never cut)."""
    data = f.read(SIGNAL_LIMIT + 1)
    if len(data) > SIGNAL_LIMIT:
        raise ValueError(f"longer than {SIGNAL_LIMIT:,} bytes")
    return bytes(data)


def _label(src: str) -> str:
    """The source as it may be printed: no query string (it may hold a key)."""
    return src.split("?", 1)[0]


def load_signal(src: str) -> list[Segment]:
    """Read and parse ``src``; :class:`SignalError` naming it when it cannot."""
    name = _label(src)
    try:
        raw = _fetch(src)
    except (OSError, ValueError) as exc:
        raise SignalError(f"{name}: cannot read the carbon signal: "
                          f"{type(exc).__name__}: {exc}") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit number
        raise SignalError(f"{name}: not JSON: {exc}") from None
    except RecursionError:
        raise SignalError(f"{name}: not JSON: nested too deeply") from None
    return parse_signal(data, name)


@dataclass
class Signal:
    """A forecast that keeps itself current: re-read when the local file changed (checked at
    most once a second) or, for a URL, every ``refresh_s``. A refresh that fails keeps the
    last good forecast and tells ``warn`` once per failure streak."""

    src: str
    refresh_s: float = REFRESH_S
    warn: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    segments: list[Segment] = field(default_factory=list)
    _read_at: float = -float("inf")
    _checked_at: float = -float("inf")
    _mtime: float | None = None
    _failing: bool = False

    def __post_init__(self) -> None:
        self.segments = load_signal(self.src)  # a bad signal fails the run at once
        self._read_at = self._checked_at = self.clock()
        self._mtime = self._stat()

    @property
    def name(self) -> str:
        return _label(self.src)

    def _local(self) -> str | None:
        if "://" not in self.src:
            return self.src
        return self.src.removeprefix("file://") if self.src.startswith("file://") else None

    def _stat(self) -> float | None:
        path = self._local()
        try:
            return os.stat(path).st_mtime_ns if path else None
        except OSError:
            return None

    def forecast(self) -> list[Segment]:
        now = self.clock()
        if now - self._checked_at < 1.0:
            return self.segments
        self._checked_at = now
        local = self._local() is not None
        if local:
            mtime = self._stat()
            stale = mtime != self._mtime
        else:
            stale = now - self._read_at >= self.refresh_s
        if stale:
            try:
                self.segments = load_signal(self.src)
                self._mtime = self._stat() if local else None
                self._failing = False
            except SignalError as exc:
                if not self._failing:
                    self.warn(f"carbon: keeping the last forecast: {exc}")
                self._failing = True
            self._read_at = now
        return self.segments
