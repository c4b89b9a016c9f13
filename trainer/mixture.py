"""The trainer's side of mixtures: the ``--mixture FILE`` it reads, and the shares it logs.

A mixture file (TOML) names datasets and says how much of each to train on, step by step::

    ramp = "linear"                 # or "step": held until the next point; default linear

    [components]
    web = "s3://bucket/web"         # a dataset URL, as --data takes
    code = "data/code"

    [[schedule]]
    step = 0                        # the first point is at step 0
    weights = { web = 9, code = 1 }

    [[schedule]]
    step = 1000                     # steps increase; after the last point its weights stay
    weights = { web = 1, code = 1 }

Every point gives a weight (finite, >= 0) to every component, and at least one is positive; a
weight of 0 switches a component off until a later point turns it on (a component that is 0
everywhere is refused: it would never be read). One point is a fixed mixture. The schedule is
:mod:`loaders.mixture_schedule`'s, by optimizer step: step ``s`` of the file is the global
batch after ``s`` steps, the one trained on at logged step ``s + 1``.

The file is user input: read bounded as a regular file (:mod:`infra.user_files`), and
every problem is one :class:`MixtureFileError` line naming the file and the key
(``schedule[1].weights.code``), which the CLI prints as ``error: ...`` with exit status 2.

:class:`MixtureMeter` counts, per rank, the samples of each component a step trained on (a
mixture's sample ids say which component each came from) and, at each metrics record, sums
them over the ranks: ``mixture``, each component's share of the samples since the previous
record, beside ``mixture_scheduled``, the shares the schedule set for those steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from infra.user_files import OPTIONS_LIMIT, UserFileError, read_text
from loaders.mixture_schedule import MAX_STEP, RAMPS, Schedule
from trainer.config import ConfigError
from trainer.distributed import all_reduce

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

#: What the file is called in error messages (and in user_files' messages).
WHAT = "mixture file"
_TOP_KEYS = ("components", "schedule", "ramp")
_POINT_KEYS = ("step", "weights")


class MixtureFileError(ConfigError):
    """A ``--mixture`` file that cannot be used: one line naming the file and the key."""


@dataclass(frozen=True)
class MixtureFile:
    """A checked mixture file: component names and URLs (in the file's order) and the
    schedule over them."""

    path: str
    names: tuple[str, ...]
    urls: tuple[str, ...]
    schedule: Schedule

    def record(self) -> dict[str, Any]:
        """What ``config.json`` keeps of it: the file's content, resolved."""
        return {"file": self.path, "ramp": self.schedule.ramp,
                "components": dict(zip(self.names, self.urls, strict=True)),
                "schedule": [{"step": s, "weights": dict(zip(self.names, w, strict=True))}
                             for s, w in zip(self.schedule.steps, self.schedule.weights,
                                             strict=True)]}


def read_mixture_file(path: str) -> MixtureFile:
    """The mixture file at ``path``, checked (module docstring); :class:`MixtureFileError`
    naming the first problem."""

    def fail(key: str, problem: str) -> MixtureFileError:
        return MixtureFileError(f"{WHAT} {path}: {key}: {problem}" if key
                                else f"{WHAT} {path}: {problem}")

    try:
        text = read_text(path, WHAT, OPTIONS_LIMIT)
    except UserFileError as exc:
        raise MixtureFileError(str(exc)) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise fail("", f"not TOML ({exc})") from None
    for key in doc:
        if key not in _TOP_KEYS:
            raise fail(key, f"unknown key (a mixture file has {', '.join(_TOP_KEYS)})")

    ramp = doc.get("ramp", "linear")
    if ramp not in RAMPS:
        raise fail("ramp", f"{ramp!r} is not one of {', '.join(map(repr, RAMPS))}")

    components = doc.get("components")
    if not isinstance(components, dict) or not components:
        raise fail("components", "missing or empty: a table of name = \"dataset URL\"")
    names = tuple(components)
    for name, url in components.items():
        if not isinstance(url, str) or not url.strip():
            raise fail(f"components.{name}", f"{url!r:.60} is not a dataset URL (a "
                                             "non-empty string)")

    points = doc.get("schedule")
    if not isinstance(points, list) or not points:
        raise fail("schedule", "missing or empty: one or more [[schedule]] tables, each "
                               "with step and weights")
    steps: list[int] = []
    weights: list[tuple[float, ...]] = []
    for p, point in enumerate(points):
        at = f"schedule[{p}]"
        if not isinstance(point, dict):
            raise fail(at, "not a table (write [[schedule]] with step and weights)")
        for key in point:
            if key not in _POINT_KEYS:
                raise fail(f"{at}.{key}", "unknown key (a point has step and weights)")
        step = point.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
            raise fail(f"{at}.step", f"{step!r:.40} is not a step (an integer in "
                                     f"[0, {MAX_STEP}])")
        if p == 0 and step != 0:
            raise fail(f"{at}.step", f"is {step}: the first point must be at step 0")
        if p and step <= steps[-1]:
            raise fail(f"{at}.step", f"{step} does not come after the previous point's "
                                     f"{steps[-1]} (steps must increase)")
        table = point.get("weights")
        if not isinstance(table, dict):
            raise fail(f"{at}.weights", "missing or not a table: weights = { name = w, ... }")
        for name, w in table.items():
            key = f"{at}.weights.{name}"
            if name not in components:
                raise fail(key, f"no such component (components: {', '.join(names)})")
            if not isinstance(w, int | float) or isinstance(w, bool):
                raise fail(key, f"{w!r:.40} is not a number")
            if not math.isfinite(w) or w < 0:
                raise fail(key, f"{w!r} is not a finite weight >= 0")
        missing = [n for n in names if n not in table]
        if missing:
            raise fail(f"{at}.weights", f"no weight for component {missing[0]!r} (give 0 to "
                                        "leave it out at this point)")
        row = tuple(float(table[n]) for n in names)
        if not sum(row) > 0:
            raise fail(f"{at}.weights", "every weight is 0 (at least one component must "
                                        "have a positive weight)")
        if not math.isfinite(sum(row)):
            raise fail(f"{at}.weights", "the weights' sum overflows (scale them down)")
        steps.append(step)
        weights.append(row)
    for i, name in enumerate(names):
        if not any(row[i] > 0 for row in weights):
            raise fail(f"components.{name}", "weight 0 at every point of the schedule (it "
                                             "would never be read: remove it)")
    try:
        schedule = Schedule(tuple(steps), tuple(weights), ramp)
    except ValueError as exc:  # checked above already: a safety net, named by the file
        raise fail("schedule", str(exc)) from None
    return MixtureFile(path, names, tuple(c.strip() for c in components.values()), schedule)


class MixtureMeter:
    """Each component's share of the samples trained on since the last record, over all
    ranks, and the shares the schedule set for the same steps.

    ``source_of``: sample ids -> component index (the mixture source's); ``scheduled``:
    ``(first_step, end_step) -> shares`` of global batches ``first_step .. end_step - 1``."""

    def __init__(self, names: Sequence[str], source_of: Callable[[np.ndarray], np.ndarray],
                 scheduled: Callable[[int, int], list[float]]) -> None:
        self.names = list(names)
        self.source_of = source_of
        self.scheduled = scheduled
        self.counts = np.zeros(len(self.names), dtype=np.int64)

    def add(self, sample_ids: torch.Tensor) -> None:
        """Count one step's samples on this rank (all its micro-batches)."""
        ids = sample_ids.detach().to("cpu", torch.int64).numpy().reshape(-1)
        self.counts += np.bincount(self.source_of(ids), minlength=len(self.names))

    def interval(self, first_step: int, end_step: int, device: torch.device
                 ) -> dict[str, dict[str, float]]:
        """The record's ``mixture`` and ``mixture_scheduled`` for global batches
        ``first_step .. end_step - 1``; starts the next interval. Collective (every rank)."""
        summed = all_reduce(torch.tensor(self.counts, dtype=torch.float64, device=device))
        total = float(summed.sum())
        shares = [float(c) / total if total else 0.0 for c in summed.tolist()]
        self.counts[:] = 0
        planned = self.scheduled(first_step, end_step)
        return {"mixture": {n: round(x, 6) for n, x in zip(self.names, shares, strict=True)},
                "mixture_scheduled": {n: round(x, 6)
                                      for n, x in zip(self.names, planned, strict=True)}}
