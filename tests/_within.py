"""A call that must return in time: run in a daemon thread, so that a regression that
blocks (a FIFO opened for reading waits for a writer forever) fails the test instead of
hanging the suite."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def within(seconds: float, call: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``(what call(*args) returned or raised, seconds taken)``; an ``AssertionError`` when
    it has not returned after ``seconds`` (the thread is left behind, blocked)."""
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(call(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=go, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(call, '__name__', call)} still blocked after {seconds} s"
    return out[0], time.monotonic() - start
