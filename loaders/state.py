"""What every saved loader state carries, and the check that it belongs to this plan.

Both resume paths use it: :class:`loaders.dataloader.ShardflowLoader` (one state per rank, the
progress as ``segments``) and :class:`loaders.dataset.TokenDataset`'s own ``state_dict`` (one
per DataLoader worker, for ``torchdata``'s ``StatefulDataLoader``). A state only means something
for the sample plan it was taken on, so each records the plan's parameters and a load refuses
any difference, naming it.
"""

from __future__ import annotations

from typing import Any, Protocol

STATE_VERSION = 1
PLAN_KEYS = ("n_samples", "seq_len", "seed", "shuffle", "block", "window_blocks")


class LoaderStateError(ValueError):
    """A saved loader state that does not belong to this dataset or plan."""


class _Planned(Protocol):
    n_samples: int
    seq_len: int
    seed: int
    shuffle: bool
    block: int
    window_blocks: int


def plan_params(dataset: _Planned) -> dict[str, Any]:
    """The parameters that fix a dataset's sample order, as saved in a state."""
    return {key: getattr(dataset, key) for key in PLAN_KEYS}


def check_state(state: dict[str, Any], dataset: _Planned) -> None:
    """Raise :class:`LoaderStateError` unless ``state`` was saved on ``dataset``'s plan."""
    if state.get("version") != STATE_VERSION:
        raise LoaderStateError(f"loader state version {state.get('version')!r}, "
                               f"expected {STATE_VERSION}")
    mine = plan_params(dataset)
    theirs = state.get("plan", {})
    diff = [f"{k}: saved {theirs.get(k)!r}, now {mine[k]!r}" for k in PLAN_KEYS
            if theirs.get(k) != mine[k]]
    if diff:
        raise LoaderStateError("loader state is for another dataset or plan ("
                               + "; ".join(diff) + ")")
