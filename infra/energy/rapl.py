"""CPU package energy from Linux powercap (Intel RAPL; AMD's driver exposes the same tree).

A zone is ``/sys/class/powercap/intel-rapl:N`` (``name`` ``package-N``): ``energy_uj`` is a
counter in microjoules that wraps to 0 after ``max_energy_range_uj``. Only package zones are
summed: their subzones (``core``, ``uncore``, ``dram``) and ``psys`` (the whole platform) overlap
them. ``energy_uj`` is readable by root only on most kernels since 2020 (CVE-2020-8694): where
it is not, :func:`find_zones` returns nothing and the meter falls back to an estimate.

:func:`counter_delta` is the pure arithmetic, tested apart from any file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

POWERCAP_ROOT = "/sys/class/powercap"


def counter_delta(before: int, after: int, max_range: int) -> int:
    """Microjoules between two readings of a counter that wraps after ``max_range``: at most
    one wrap is assumed, so a meter must read more often than a wrap takes (minutes at
    hundreds of watts; :data:`infra.energy.meter.SAMPLE_S` is far below that)."""
    if after >= before:
        return after - before
    return (max_range - before) + after + 1 if max_range > 0 else after


@dataclass(frozen=True)
class Zone:
    path: str
    name: str
    max_range_uj: int

    def read_uj(self) -> int:
        with open(os.path.join(self.path, "energy_uj"), encoding="ascii") as f:
            return int(f.read().strip())


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def find_zones(root: str = POWERCAP_ROOT) -> list[Zone]:
    """The package zones whose counter this process can read (none where powercap is absent
    or root-only)."""
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return []
    zones = []
    for entry in entries:
        # top-level zones only: "intel-rapl:0", not its subzones "intel-rapl:0:1", nor
        # "intel-rapl-mmio:0", the same package's counter by another interface
        if entry.count(":") != 1 or "mmio" in entry:
            continue
        path = os.path.join(root, entry)
        name = _read(os.path.join(path, "name")) or ""
        if not name.startswith("package"):
            continue
        energy, max_range = _read(os.path.join(path, "energy_uj")), _read(
            os.path.join(path, "max_energy_range_uj"))
        if energy is None or not energy.isdigit():
            continue
        zones.append(Zone(path, name, int(max_range) if max_range and max_range.isdigit()
                          else 0))
    return zones
