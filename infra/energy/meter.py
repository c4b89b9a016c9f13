"""Energy of a piece of work: measured where the hardware says (RAPL, NVML), else estimated.

Three parts, each tested apart:

- :func:`snapshot` reads this process's counters (CPU time; the host's RAPL package counters;
  the chosen GPUs' NVML counters) into a small dict: cheap (a few file reads), picklable, so
  the pipeline gathers one from every Dask worker with ``client.run``;
- :class:`Accumulator` (pure: fed snapshots, never reads a clock or a file) turns a series of
  them into joules: RAPL per host (one reading per host, whichever process took it; wraps
  handled by :func:`infra.energy.rapl.counter_delta`), NVML per device, and CPU seconds per
  process;
- :class:`Energy` is the result: joules, ``source`` and the parts, J/token and gCO2e.

``source`` is ``rapl`` or ``nvml`` only when every joule of the figure was measured by that
counter (``rapl+nvml``: both); any estimated part makes the whole figure ``estimate``, so an
estimate is never shown as a measurement. The estimate is CPU time x :data:`WATTS_PER_CORE`,
as CodeCarbon does when it has no counter (its fallback is a CPU's TDP; we have no CPU table,
so one figure per busy core: 85 W over 8 cores, CodeCarbon's default TDP, rounds to 10 W).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.energy import nvml, rapl

#: the estimate's power of one busy core, in watts (see the module's text)
WATTS_PER_CORE = 10.0
#: how often a running meter reads counters in the background (a RAPL counter wraps after
#: ~262 kJ: over 20 minutes at 200 W)
SAMPLE_S = 30.0
#: joules in a kilowatt-hour
J_PER_KWH = 3.6e6

_ZONES: dict[str, list[rapl.Zone]] = {}
_GPUS: dict[tuple[int, ...] | None, nvml.Devices | None] = {}


def grams(joules: float, g_per_kwh: float) -> float:
    """gCO2e of ``joules`` at a grid intensity of ``g_per_kwh``."""
    return joules / J_PER_KWH * g_per_kwh


def snapshot(rapl_root: str = rapl.POWERCAP_ROOT, gpus: Sequence[int] | None = (),
             with_rapl: bool = True) -> dict[str, Any]:
    """This process's counters now. ``gpus``: NVML device indices to read (``()`` none,
    ``None`` all); ``with_rapl=False`` leaves the host's package counters out (a second rank
    on a host, whose first rank reads them)."""
    t = os.times()
    snap: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(),
                            "cpu_s": t.user + t.system, "t": time.time()}
    if with_rapl:
        if rapl_root not in _ZONES:
            _ZONES[rapl_root] = rapl.find_zones(rapl_root)
        zones = []
        for z in _ZONES[rapl_root]:
            try:
                zones.append((z.path, z.read_uj(), z.max_range_uj))
            except (OSError, ValueError):
                continue
        if zones:
            snap["rapl"] = zones
    if gpus != ():
        key = None if gpus is None else tuple(gpus)
        if key not in _GPUS:
            _GPUS[key] = nvml.open_devices(gpus)
        devices = _GPUS[key]
        if devices is not None:
            with contextlib.suppress(Exception):  # an NVML error mid-run: GPUs left out
                snap["gpu_mj"] = devices.read_mj()
    return snap


@dataclass(frozen=True)
class Energy:
    """Joules of one piece of work and where they come from."""

    rapl_j: float = 0.0
    nvml_j: float = 0.0
    estimate_j: float = 0.0
    cpu_s: float = 0.0
    seconds: float = 0.0

    @property
    def joules(self) -> float:
        return self.rapl_j + self.nvml_j + self.estimate_j

    @property
    def source(self) -> str:
        if self.estimate_j > 0 or not (self.rapl_j or self.nvml_j):
            return "estimate"
        return "+".join(n for n, j in (("rapl", self.rapl_j), ("nvml", self.nvml_j)) if j)

    def __sub__(self, other: Energy) -> Energy:
        return Energy(self.rapl_j - other.rapl_j, self.nvml_j - other.nvml_j,
                      self.estimate_j - other.estimate_j, self.cpu_s - other.cpu_s,
                      self.seconds - other.seconds)

    def __add__(self, other: Energy) -> Energy:
        return Energy(self.rapl_j + other.rapl_j, self.nvml_j + other.nvml_j,
                      self.estimate_j + other.estimate_j, self.cpu_s + other.cpu_s,
                      self.seconds + other.seconds)

    def record(self, tokens: int = 0, g_per_kwh: float | None = None) -> dict[str, Any]:
        """The JSON form (manifest ``stats.energy``, summaries): joules, source, the parts,
        J/token where ``tokens``, gCO2e where an intensity is known."""
        rec: dict[str, Any] = {"joules": round(self.joules, 3), "source": self.source,
                               "cpu_seconds": round(self.cpu_s, 3),
                               "seconds": round(self.seconds, 3)}
        parts = {k: round(v, 3) for k, v in (("rapl", self.rapl_j), ("nvml", self.nvml_j),
                                             ("estimate", self.estimate_j)) if v}
        if len(parts) > 1:
            rec["parts"] = parts
        if tokens > 0:
            rec["joules_per_token"] = self.joules / tokens
        if g_per_kwh is not None:
            rec["grid_g_per_kwh"] = round(g_per_kwh, 3)
            rec["gco2e"] = round(grams(self.joules, g_per_kwh), 6)
        return rec


@dataclass
class Accumulator:
    """Joules so far from a series of snapshot batches (one batch: every process's snapshot
    taken at one moment). Pure: the caller reads the counters.

    A process's CPU time counts from its first snapshot; RAPL and NVML per host and device
    from the first reading of each. CPU time of processes on a host whose RAPL was read is
    inside that measurement, so it is not estimated again.
    """

    watts_per_core: float = WATTS_PER_CORE
    total: Energy = field(default_factory=Energy)
    _cpu: dict[tuple[str, int], float] = field(default_factory=dict)
    _rapl: dict[tuple[str, str], int] = field(default_factory=dict)
    _gpu: dict[tuple[str, int], int] = field(default_factory=dict)
    _t: float | None = None

    def add(self, batch: Iterable[dict[str, Any]]) -> Energy:
        """Take one batch in; returns the running total."""
        rapl_j = nvml_j = est_j = cpu = 0.0
        measured_hosts = set()
        batch = list(batch)
        read: set[tuple[str, str]] = set()
        for s in batch:
            host = s["host"]
            for path, uj, max_uj in s.get("rapl", ()):
                key = (host, path)
                if key in read:  # one reading per host and batch: several processes on a
                    continue     # host read its counters a moment apart, not in order
                read.add(key)
                if key in self._rapl:
                    rapl_j += rapl.counter_delta(self._rapl[key], uj, max_uj) / 1e6
                self._rapl[key] = uj
                measured_hosts.add(host)
            for idx, mj in s.get("gpu_mj", {}).items():
                gkey = (host, int(idx))
                if gkey in self._gpu:
                    nvml_j += max(0, mj - self._gpu[gkey]) / 1e3
                self._gpu[gkey] = mj
        measured_hosts |= {h for (h, _p) in self._rapl}
        for s in batch:
            pkey = (s["host"], int(s["pid"]))
            if pkey in self._cpu:
                d = max(0.0, s["cpu_s"] - self._cpu[pkey])
                cpu += d
                if s["host"] not in measured_hosts:
                    est_j += d * self.watts_per_core
            self._cpu[pkey] = s["cpu_s"]
        ts = [s["t"] for s in batch if "t" in s]
        dt = 0.0
        if ts:
            t = max(ts)
            dt = max(0.0, t - self._t) if self._t is not None else 0.0
            self._t = t
        self.total = self.total + Energy(rapl_j, nvml_j, est_j, cpu, dt)
        return self.total
