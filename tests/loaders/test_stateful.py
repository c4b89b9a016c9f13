"""TokenDataset as a torchdata Stateful dataset: StatefulDataLoader resumes the exact batches."""

from __future__ import annotations

import itertools
import json
import pickle

import pytest

from loaders import TokenDataset, build_dataloader
from loaders.state import LoaderStateError

# In the dev extra; the loaders themselves never import it.
stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = stateful_dataloader.StatefulDataLoader
# torchdata 0.11 calls an API that torch has since deprecated; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

SEQ = 32
BATCH = 8


def _sdl(dataset: str, workers: int, batch: int = BATCH):  # type: ignore[no-untyped-def]
    ds = TokenDataset(dataset, SEQ, rank=0, world_size=1, batch_size=batch,
                      return_sample_id=True)
    return StatefulDataLoader(ds, batch_size=batch, num_workers=workers)


def _batches(loader, limit: int | None = None) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [b["sample_id"].tolist() for b in itertools.islice(loader, limit)]


def _dataset_states(state: dict) -> list[dict]:
    """The TokenDataset states inside a StatefulDataLoader state (one per worker)."""
    found = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "yielded" in node and "plan" in node:
                found.append(node)
            for value in node.values():
                walk(value)

    walk(state)
    return found


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_continues_the_exact_batch_sequence(tiny_dataset: str, workers: int) -> None:
    reference = build_dataloader(tiny_dataset, BATCH, SEQ, rank=0, world_size=1,
                                 return_sample_id=True)
    epochs = []
    for epoch in (1, 2):
        reference.set_epoch(epoch)
        epochs.append(_batches(reference))

    first = _sdl(tiny_dataset, workers)
    first.dataset.set_epoch(1)
    it = iter(first)
    head = [next(it)["sample_id"].tolist() for _ in range(7)]  # mid-way round the workers
    state = pickle.loads(pickle.dumps(first.state_dict()))  # as a checkpoint would carry it
    del it

    per_worker = _dataset_states(state)
    assert len(per_worker) == max(workers, 1)
    assert sum(s["yielded"] for s in per_worker) == 7 * BATCH
    assert all(s["epoch"] == 1 and len(json.dumps(s)) < 400 for s in per_worker)  # O(1)

    resumed = _sdl(tiny_dataset, workers)  # a fresh process would start exactly so
    resumed.load_state_dict(state)
    rest = _batches(resumed)
    assert head + rest == epochs[0]  # the uninterrupted epoch, batch for batch
    assert len(rest) == len(epochs[0]) - 7 > 0
    resumed.dataset.set_epoch(2)  # the next epoch is whole again
    assert _batches(resumed) == epochs[1]


def test_state_from_another_layout_is_refused(tiny_dataset: str) -> None:
    first = _sdl(tiny_dataset, 0)
    _batches(first, limit=3)
    state = first.state_dict()
    other = _sdl(tiny_dataset, 0, batch=BATCH * 2)  # another global batch: another plan
    other.load_state_dict(state)
    with pytest.raises(LoaderStateError, match="lanes: saved 8, now 16"):
        next(iter(other))
