"""A bounded window of live Dask tasks: the driver submits the next task as one finishes.

Why: the scheduler spends ~10 kB and 0.2-1 ms per task it knows of, and the driver a future
per task. Submitting every partition's task at once (3 M partitions at 50 TB) grows both with
the input until the client loses its own scheduler. A window of a few tasks per worker thread
keeps every thread busy (the next task is already queued on the scheduler when one finishes)
while the number of tasks alive anywhere stays bounded by the cluster, not by the input.

The window follows the cluster: its size is recomputed from the scheduler's current thread
count (cached for a second), so workers that join get work at once and a shrinking cluster
holds fewer tasks. The sizing rule is pure (:func:`window_size`) and tested apart.

Two optional hooks (``pipeline.driver.carbon`` sets them): ``gate(block)`` is asked before each
task is
submitted (False: not now; with ``block``, when no task is live, it waits until it may say
True), so carbon-aware admission pauses new work while live tasks finish; ``on_stage(name)``
hears the name of each ``run``'s tasks (Dask's key prefix: ``phase1``, ``phase2``, ...) when its
first one is submitted, for per-stage energy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from dask.utils import key_split
from distributed import Client, Future, as_completed

T = TypeVar("T")

#: live tasks per worker thread: one running, the rest queued so a thread never waits on the
#: driver's round trip for its next task
WINDOW_FACTOR = 4
#: at least this many live tasks (a cluster still starting reports no threads)
WINDOW_FLOOR = 8
#: never more than this many live tasks, whatever the cluster's size
WINDOW_CAP = 20_000
#: how long a thread count read from the scheduler is trusted
REFRESH_S = 1.0

_END = object()


def window_size(threads: int, factor: int = WINDOW_FACTOR, floor: int = WINDOW_FLOOR,
                cap: int = WINDOW_CAP) -> int:
    """Live tasks allowed for a cluster of ``threads`` worker threads."""
    if factor < 1 or floor < 1 or cap < floor:
        raise ValueError(f"need factor >= 1 and 1 <= floor <= cap, got {factor}, {floor}, {cap}")
    return max(floor, min(cap, factor * max(0, threads)))


class TaskWindow:
    """Runs tasks on ``client`` with at most :func:`window_size` of them alive at once.

    ``max_live`` records the most tasks that were alive together (for tests and benchmarks).
    """

    def __init__(self, client: Client, factor: int = WINDOW_FACTOR, floor: int = WINDOW_FLOOR,
                 cap: int = WINDOW_CAP) -> None:
        self.client = client
        self.factor, self.floor, self.cap = factor, floor, cap
        self.max_live = 0
        self.submitted = 0
        self._threads = 0
        self._read_at = -float("inf")
        self.gate: Callable[[bool], bool] | None = None
        self.on_stage: Callable[[str], None] | None = None

    def threads(self) -> int:
        """The cluster's worker threads now (re-read at most every :data:`REFRESH_S`)."""
        now = time.monotonic()
        if now - self._read_at >= REFRESH_S:
            workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
            self._threads = sum(int(w.get("nthreads", 1)) for w in workers.values())
            self._read_at = now
        return self._threads

    def size(self) -> int:
        return window_size(self.threads(), self.factor, self.floor, self.cap)

    def run(self, submit: Callable[[T], Future], items: Iterable[T]) -> Iterator[tuple[T, Any]]:
        """``(item, result)`` for every item, in completion order; ``submit(item)`` makes its
        task, called only when the window has room. A failed task raises its error here (after
        Dask's retries); the tasks still alive are released with their futures."""
        pending = iter(items)
        live = as_completed()
        owner: dict[str, T] = {}
        held: list[Any] = []  # an item taken while the gate was closed
        named = False

        def top_up() -> None:
            nonlocal named
            limit = self.size()
            while len(owner) < limit:
                item = held.pop() if held else next(pending, _END)
                if item is _END:
                    return
                if self.gate is not None and not self.gate(not owner):
                    held.append(item)
                    return
                fut = submit(item)  # type: ignore[arg-type]
                if not named and self.on_stage is not None:
                    self.on_stage(key_split(fut.key))
                    named = True
                owner[fut.key] = item  # type: ignore[assignment]
                live.add(fut)
                self.submitted += 1
                self.max_live = max(self.max_live, len(owner))

        top_up()
        for fut in live:
            item = owner.pop(fut.key)
            result = fut.result()
            fut.release()
            yield item, result
            top_up()

    def map(self, submit: Callable[[T], Future], items: Iterable[T]) -> list[Any]:
        """The results of :meth:`run` in the items' order (for steps whose callers need every
        result at once, such as the dedup shuffle's count matrices)."""
        listed = list(items)
        out: list[Any] = [None] * len(listed)
        for i, result in self.run(lambda i: submit(listed[i]), range(len(listed))):
            out[i] = result
        return out
