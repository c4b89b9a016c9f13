"""A dependency-free progress bar for the driver's terminal (stderr)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _si(n: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}P"


class ProgressBar:
    """Redraws in place on a terminal; prints a line every few seconds otherwise (CI logs)."""

    def __init__(self, total: int, label: str = "partitions", stream: TextIO | None = None,
                 enabled: bool = True, width: int = 30) -> None:
        self.total, self.label, self.width, self.enabled = total, label, width, enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self.tokens = 0
        self.start = time.perf_counter()
        self._last_print = 0.0

    def update(self, done: int = 1, tokens: int = 0) -> None:
        self.done += done
        self.tokens += tokens
        now = time.perf_counter()
        if not self.enabled:
            return
        if self.tty or now - self._last_print > 5 or self.done == self.total:
            self._last_print = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = self.done / self.total if self.total else 1.0
        filled = int(frac * self.width)
        elapsed = now - self.start
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done:,}/{self.total:,} "
                f"{self.label}  {_si(self.tokens)} tokens  {_si(rate)} tok/s  {elapsed:.1f}s")
        end = "" if self.tty and self.done < self.total else "\n"
        self.stream.write(("\r" if self.tty else "") + line + end)
        self.stream.flush()
