"""The loader benchmark's reading of what the rest of the machine did during a run."""

from __future__ import annotations

import time

import pytest

from benchmarks.loader_throughput import _machine_cpu_s, machine_share


def test_the_rest_of_the_machine_is_its_busy_time_less_the_run_s_own() -> None:
    got = machine_share((100.0, 5.0), (104.0, 5.5), own_cpu_s=3.0, wall_s=2.0)
    assert got == {"other_cores": pytest.approx(0.5), "steal_cores": pytest.approx(0.25)}
    # the run's own CPU counted beyond the machine's (clock ticks): never below zero
    assert machine_share((0.0, 0.0), (1.0, 0.0), own_cpu_s=1.2, wall_s=1.0)["other_cores"] == 0
    assert machine_share(None, (1.0, 0.0), 0.0, 1.0) == {}
    assert machine_share((0.0, 0.0), (1.0, 0.0), 0.0, 0.0) == {}


def test_a_busy_thread_here_shows_as_busy_machine_time() -> None:
    before = _machine_cpu_s()
    if before is None:
        pytest.skip("no /proc/stat on this system")
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        pass
    after = _machine_cpu_s()
    assert after is not None
    assert after[0] - before[0] >= 0.2  # this process's own spin, counted as the machine's
    assert after[1] >= before[1]
