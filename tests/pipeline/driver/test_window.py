"""The bounded task window: its sizing rule (pure, property-tested) and, on a real
LocalCluster, that the scheduler never holds more than a window of the job's tasks."""

from __future__ import annotations

import time

import pytest
from distributed import Client, LocalCluster
from hypothesis import given
from hypothesis import strategies as st

from pipeline.driver.window import WINDOW_CAP, WINDOW_FLOOR, TaskWindow, window_size


@given(st.integers(0, 10**7), st.integers(1, 64), st.integers(1, 100), st.integers(0, 10**6))
def test_window_size_is_a_clamped_multiple_of_threads(threads: int, factor: int, floor: int,
                                                      extra: int) -> None:
    cap = floor + extra
    size = window_size(threads, factor, floor, cap)
    assert floor <= size <= cap
    assert size == max(floor, min(cap, factor * threads))
    assert window_size(threads + 1, factor, floor, cap) >= size  # more threads, never fewer


def test_defaults_bound_live_tasks_whatever_the_cluster() -> None:
    assert window_size(0) == WINDOW_FLOOR
    assert window_size(10**6) == WINDOW_CAP == 20_000
    with pytest.raises(ValueError):
        window_size(4, factor=0)


def _slow_square(x: int) -> int:
    time.sleep(0.01)
    return x * x


def _scheduler_tasks(dask_scheduler) -> int:  # type: ignore[no-untyped-def]
    return len(dask_scheduler.tasks)


@pytest.fixture(scope="module")
def client() -> Client:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def test_run_yields_every_result_with_a_bounded_scheduler(client: Client) -> None:
    window = TaskWindow(client, factor=2, floor=3)
    assert window.size() == 4  # 2 workers x 1 thread x 2
    seen, most = {}, 0
    for item, result in window.run(lambda i: client.submit(_slow_square, i, pure=False),
                                   range(200)):
        seen[item] = result
        most = max(most, client.run_on_scheduler(_scheduler_tasks))
    assert seen == {i: i * i for i in range(200)}
    assert window.submitted == 200 and window.max_live == 4
    assert most <= 4  # the scheduler never knew of more than a window of tasks


def test_map_keeps_the_items_order_and_errors_surface(client: Client) -> None:
    window = TaskWindow(client, factor=1, floor=2)
    assert window.map(lambda i: client.submit(_slow_square, i, pure=False),
                      range(30)) == [i * i for i in range(30)]
    with pytest.raises(ZeroDivisionError):
        window.map(lambda i: client.submit(lambda x: 1 // x, i, pure=False), [3, 2, 0, 1])


def test_the_window_grows_when_a_worker_joins() -> None:
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        window = TaskWindow(c, factor=3, floor=1)
        assert window.size() == 3
        cluster.scale(3)
        c.wait_for_workers(3, timeout=60)
        time.sleep(1.1)  # past the cached thread count
        assert window.size() == 9
