"""A recipe checked before anything is written: in the driver (every entry's class found, its
options bound to its constructor), then on every worker (each imports every step's class), so
that a user step missing from a worker's path stops the run with one line naming the step and
the worker, not a traceback per task after the first shards are written."""

from __future__ import annotations

from typing import Any

from pipeline.steps.contract import StepError
from pipeline.steps.recipe import Recipe
from pipeline.steps.registry import check_options, step_class

#: how long the workers have to import the steps (a heavy user module may take a while)
IMPORT_TIMEOUT_S = 300.0


def resolved(recipe: Recipe) -> list[dict[str, Any]]:
    """The recipe as the manifest records it: each entry with its step's ``version``
    (checked: the class exists and takes the options)."""
    out = []
    for spec in recipe.steps:
        cls = check_options(spec)
        entry = spec.as_dict()
        entry["version"] = cls.version
        out.append(entry)
    return out


def import_steps(uses: list[str]) -> str | None:
    """Run on a worker: ``None`` when every class imports, else the first error."""
    try:
        for use in uses:
            step_class(use)
    except StepError as exc:
        return str(exc)
    return None


def check_on_workers(client: Any, recipe: Recipe) -> None:
    """Every worker imports every step class; :class:`StepError` naming the first worker
    that cannot (and the step) otherwise."""
    uses = sorted({s.use for s in recipe.steps})
    answers = client.run(import_steps, uses, wait=True)
    for worker, error in sorted(answers.items()):
        if error is not None:
            raise StepError(f"worker {worker}: {error}")
