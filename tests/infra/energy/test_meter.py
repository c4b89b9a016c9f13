"""The energy meter: RAPL read from a fake powercap tree (wraparound included), the pure
accumulator, and the real path of this machine, whichever it is."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from infra.energy import Accumulator, Energy, grams, snapshot
from infra.energy.meter import J_PER_KWH, WATTS_PER_CORE
from infra.energy.rapl import counter_delta, find_zones


def _zone(root: Path, name: str, label: str, uj: int, max_uj: int = 1_000_000) -> Path:
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def test_rapl_reader_sums_packages_and_survives_a_wrap(tmp_path: Path) -> None:
    root = tmp_path / "powercap"
    p0 = _zone(root, "intel-rapl:0", "package-0", 900_000)
    p1 = _zone(root, "intel-rapl:1", "package-1", 10_000)
    _zone(root, "intel-rapl:0:0", "core", 5)         # inside package-0: never added again
    _zone(root, "intel-rapl:0:2", "dram", 5)
    _zone(root, "intel-rapl-mmio:0", "package-0", 5)  # the same package over MMIO
    _zone(root, "intel-rapl:2", "psys", 5)             # the whole platform: overlaps packages
    assert [z.name for z in find_zones(str(root))] == ["package-0", "package-1"]

    acc = Accumulator()
    acc.add([snapshot(str(root))])
    # package-0 wraps: 900,000 -> max 1,000,000 -> 0 -> 150,000 = 250,001 uJ
    (p0 / "energy_uj").write_text("150000\n")
    (p1 / "energy_uj").write_text("310000\n")  # +300,000 uJ
    total = acc.add([snapshot(str(root))])
    assert total.rapl_j == (250_001 + 300_000) / 1e6
    assert total.estimate_j == 0.0 and total.source == "rapl"
    assert total.record()["source"] == "rapl"


def test_unreadable_or_absent_powercap_is_no_zone(tmp_path: Path) -> None:
    assert find_zones(str(tmp_path / "absent")) == []
    z = _zone(tmp_path, "intel-rapl:0", "package-0", 1)
    (z / "energy_uj").write_text("permission denied?\n")  # what a non-number reads as
    assert find_zones(str(tmp_path)) == []


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 10**6))
def test_counter_delta_is_the_distance_forward_around_the_ring(a: int, step: int,
                                                                max_range: int) -> None:
    a %= max_range + 1
    b = (a + step % (max_range + 1)) % (max_range + 1)
    assert counter_delta(a, b, max_range) == step % (max_range + 1)


def _snap(host: str, pid: int, cpu: float, t: float, **kw: object) -> dict[str, object]:
    return {"host": host, "pid": pid, "cpu_s": cpu, "t": t, **kw}


def test_accumulator_estimates_cpu_only_where_no_counter_measured_the_host() -> None:
    acc = Accumulator(watts_per_core=10.0)
    acc.add([_snap("a", 1, 5.0, 0.0), _snap("b", 2, 1.0, 0.0, rapl=[("z", 100, 10**9)])])
    total = acc.add([_snap("a", 1, 7.0, 10.0), _snap("b", 2, 9.0, 10.0,
                                                     rapl=[("z", 3_000_100, 10**9)])])
    assert total.estimate_j == 20.0  # host a: 2 CPU-s x 10 W; host b's 8 CPU-s are in RAPL
    assert total.rapl_j == 3.0 and total.cpu_s == 10.0 and total.seconds == 10.0
    assert total.source == "estimate"  # any estimated part: the figure is an estimate
    assert total.record()["parts"] == {"rapl": 3.0, "estimate": 20.0}
    # A process that appears later counts from its first snapshot; one reading per host.
    total = acc.add([_snap("a", 1, 7.0, 20.0), _snap("a", 3, 50.0, 20.0),
                     _snap("b", 4, 0.0, 20.0, rapl=[("z", 4_000_100, 10**9)]),
                     _snap("b", 2, 9.0, 20.0, rapl=[("z", 3_999_000, 10**9)])])
    assert total.estimate_j == 20.0 and total.rapl_j == 4.0


def test_nvml_counters_are_per_device_and_labelled() -> None:
    acc = Accumulator()
    acc.add([_snap("g", 1, 0.0, 0.0, gpu_mj={0: 1_000, 1: 5_000})])
    e = acc.add([_snap("g", 1, 0.0, 1.0, gpu_mj={0: 301_000, 1: 5_000})])
    assert e.nvml_j == 300.0 and e.source == "nvml"  # no CPU time: nothing estimated
    assert Energy(rapl_j=1.0, nvml_j=2.0).source == "rapl+nvml"
    assert Energy(nvml_j=2.0).source == "nvml"


def test_energy_record_and_grams() -> None:
    assert grams(J_PER_KWH, 400.0) == 400.0
    rec = Energy(estimate_j=36.0, cpu_s=3.6, seconds=2.0).record(tokens=12, g_per_kwh=100.0)
    assert rec["joules"] == 36.0 and rec["source"] == "estimate"
    assert rec["joules_per_token"] == 3.0 and rec["gco2e"] == 0.001


def test_the_real_path_of_this_machine() -> None:
    """Whatever this machine offers: RAPL when its counters are readable, else an estimate
    labelled so (never an estimate called a measurement)."""
    readable = bool(find_zones())
    acc = Accumulator()
    acc.add([snapshot()])
    end = time.process_time() + 0.2
    while time.process_time() < end:  # burn 0.2 s of CPU
        pass
    e = acc.add([snapshot()])
    assert e.cpu_s >= 0.15
    if readable:
        assert e.source == "rapl" and e.rapl_j > 0 and e.estimate_j == 0
    else:
        assert e.source == "estimate" and e.rapl_j == 0
        assert abs(e.estimate_j - e.cpu_s * WATTS_PER_CORE) < 1e-9
    print(f"powercap readable: {readable}; {e.record()} (pid {os.getpid()})")
