"""Exact resume: state_dict()/load_state_dict() across workers, world sizes and epochs."""

from __future__ import annotations

import itertools
import json

import pytest

from loaders import build_dataloader
from loaders.dataloader import LoaderStateError

SEQ = 32


def _ids(loader, limit: int | None = None) -> list[int]:
    out: list[int] = []
    for batch in itertools.islice(loader, limit):  # takes no batch beyond the limit
        out += batch["sample_id"].tolist()
    return out


def _loader(ds: str, batch: int, rank: int = 0, world: int = 1, workers: int = 0, **kw):
    return build_dataloader(ds, batch, SEQ, num_workers=workers, rank=rank, world_size=world,
                            return_sample_id=True, **kw)


def test_state_is_small_and_json(tiny_dataset: str) -> None:
    loader = _loader(tiny_dataset, 4)
    _ids(loader, limit=5)
    state = loader.state_dict()
    assert len(json.dumps(state)) < 400
    assert state["segments"] == [[1, 4, 5]]


@pytest.mark.parametrize("workers_before,workers_after", [(0, 0), (0, 2), (2, 0)])
def test_resume_continues_exactly_with_other_num_workers(
        tiny_dataset: str, workers_before: int, workers_after: int) -> None:
    full = _ids(_loader(tiny_dataset, 8, workers=0))
    first = _loader(tiny_dataset, 8, workers=workers_before)
    head = _ids(first, limit=7)
    resumed = _loader(tiny_dataset, 8, workers=workers_after)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + _ids(resumed) == full


def test_resume_at_last_batch_and_across_epochs(tiny_dataset: str) -> None:
    ref = _loader(tiny_dataset, 16)
    epochs = []
    for e in range(2):
        ref.set_epoch(e)
        epochs.append(_ids(ref))
    n = len(ref)
    first = _loader(tiny_dataset, 16)
    head = _ids(first, limit=n - 1)
    state = first.state_dict()
    resumed = _loader(tiny_dataset, 16)
    resumed.load_state_dict(state)
    assert resumed.remaining() == 1
    assert head + _ids(resumed) == epochs[0]
    done = resumed.state_dict()  # the whole epoch consumed
    again = _loader(tiny_dataset, 16)
    again.load_state_dict(done)
    assert again.remaining() == 0
    again.set_epoch(1)
    assert _ids(again) == epochs[1] != epochs[0]


@pytest.mark.parametrize("new_world", [1, 3])
def test_elastic_resume_at_same_global_batch(tiny_dataset: str, new_world: int) -> None:
    """2 ranks x batch 6 stop after 4 steps; resume on 1 rank x 12 or 3 ranks x 4."""
    global_batch = 12
    loaders = [_loader(tiny_dataset, global_batch // 2, rank=r, world=2) for r in range(2)]
    seen = []
    for ld in loaders:
        seen += _ids(ld, limit=4)
    state = loaders[0].state_dict()
    assert state == loaders[1].state_dict()  # the same on every rank
    batch = global_batch // new_world
    resumed = [_loader(tiny_dataset, batch, rank=r, world=new_world) for r in range(new_world)]
    counts = set()
    for ld in resumed:
        ld.load_state_dict(state)
        ids = _ids(ld)
        counts.add(len(ids))
        seen += ids
    assert len(counts) == 1  # equal batches on every new rank
    n = resumed[0].dataset.n_samples
    assert set(seen) == set(range(n))
    assert len(seen) - n < 2 + new_world  # only padding repeats


def test_state_from_another_plan_is_refused(tiny_dataset: str) -> None:
    state = _loader(tiny_dataset, 4).state_dict()
    other = build_dataloader(tiny_dataset, 4, SEQ + 1, rank=0, world_size=1)
    with pytest.raises(LoaderStateError, match="seq_len: saved 32, now 33"):
        other.load_state_dict(state)
