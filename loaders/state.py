"""What a saved loader state carries, and the check that it belongs to this plan.

A state is the :class:`loaders.plan.Progress` value (epoch, samples consumed per lane, and
mid-step only, how far into this rank's share of the next global batch) plus the plan's
identity: the source's parameters and the number of lanes. A state only means something for
the plan it was taken on, so a load refuses any difference, naming it. World size, per-rank
batch size and ``num_workers`` are not part of it: they may change at a resume (at a global
batch boundary).
"""

from __future__ import annotations

from typing import Any

from loaders.plan import Progress

STATE_VERSION = 2
#: plan settings a state records only when they differ from these (what an absent key means)
PLAN_DEFAULTS: dict[str, Any] = {"run_blocks": 1}


class LoaderStateError(ValueError):
    """A saved loader state that does not belong to this dataset or plan."""


def progress_state(progress: Progress) -> dict[str, Any]:
    return {"epoch": progress.epoch, "lane_pos": progress.lane_pos,
            "into_step": progress.into_step,
            "mid_step_layout": list(progress.mid_step_layout or []) or None}


#: Largest epoch or sample count a state may hold (2**53: exact as a JSON number anywhere).
MAX_COUNT = 1 << 53


def _count(value: Any, name: str, lo: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= MAX_COUNT:
        raise LoaderStateError(f"loader state field {name!r} is {value!r:.40}, not an integer "
                               f"in [{lo}, {MAX_COUNT}]")
    return value


def progress_from_state(state: dict[str, Any]) -> Progress:
    """The :class:`Progress` in ``state``; :class:`LoaderStateError` naming the field that is
    missing or not a count (a state is read from a checkpoint: outside input)."""
    for key in ("epoch", "lane_pos", "into_step"):
        if key not in state:
            raise LoaderStateError(f"loader state field {key!r} is missing")
    mid = state.get("mid_step_layout")
    if mid is not None and (not isinstance(mid, list | tuple) or len(mid) != 2):
        raise LoaderStateError(f"loader state field 'mid_step_layout' is {mid!r:.40}, not "
                               "[world size, batch size]")
    return Progress(_count(state["epoch"], "epoch"), _count(state["lane_pos"], "lane_pos"),
                    _count(state["into_step"], "into_step"),
                    (_count(mid[0], "mid_step_layout", 1), _count(mid[1], "mid_step_layout", 1))
                    if mid else None)


def make_state(progress: Progress, plan: dict[str, Any]) -> dict[str, Any]:
    return {"version": STATE_VERSION, **progress_state(progress), "plan": dict(plan)}


def check_state(state: dict[str, Any], plan: dict[str, Any]) -> Progress:
    """The progress in ``state``; :class:`LoaderStateError` unless it is for ``plan``."""
    if not isinstance(state, dict):
        raise LoaderStateError(f"loader state is a {type(state).__name__}, not a dict")
    if state.get("version") != STATE_VERSION:
        raise LoaderStateError(
            f"loader state version {state.get('version')!r}, expected {STATE_VERSION} (a "
            "state saved by a loader before the per-lane plan cannot be continued: its order "
            "was another one)")
    theirs = state.get("plan", {})
    if not isinstance(theirs, dict):
        raise LoaderStateError(f"loader state field 'plan' is {theirs!r:.40}, not a dict")
    # Both sides' keys: a setting recorded only when not its default is absent on one side
    # when the two differ (and absent from every state saved before it existed).
    def value(side: dict[Any, Any], k: Any) -> Any:
        return side.get(k, PLAN_DEFAULTS.get(k))

    diff = [f"{k}: saved {value(theirs, k)!r}, now {value(plan, k)!r}"
            for k in sorted(set(plan) | set(theirs), key=str)
            if value(theirs, k) != value(plan, k)]
    if diff:
        hint = (" (lanes default to the global batch size: pass lanes= to keep the saved "
                "plan)") if any(d.startswith("lanes") for d in diff) else ""
        raise LoaderStateError("loader state is for another dataset or plan ("
                               + "; ".join(diff) + ")" + hint)
    return progress_from_state(state)
