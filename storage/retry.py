"""Back-off with jitter, and telling throttling apart from other failures.

Throttling (HTTP 503 SlowDown) means "this replica is fine, ask again later": it is retried on
the same replica with exponential back-off and full jitter, so that many readers do not retry
in lock-step. Any other error moves the read to another replica at once.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

_THROTTLE_MARKERS = ("SlowDown", "Slow Down", "TooManyRequests", "RequestLimitExceeded",
                     "reduce your request rate", "503")


def is_throttle(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in _THROTTLE_MARKERS)


@dataclass(frozen=True)
class Backoff:
    base_s: float = 0.1
    cap_s: float = 5.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full-jitter delay before retry ``attempt`` (0-based): uniform in [0, min(cap, b*2^a)]."""
        ceiling = min(self.cap_s, self.base_s * (2 ** attempt))
        return (rng or random).uniform(0, ceiling)

    def sleep(self, attempt: int) -> None:
        time.sleep(self.delay(attempt))
