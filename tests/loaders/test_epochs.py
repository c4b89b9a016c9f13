"""Iterating a loader again reads the next epoch, unless ``set_epoch`` chose one since; a
state taken anywhere, also at the end of a pass, continues the same sequence of batches.

Lightning calls ``set_epoch`` only on a sampler, so a loader that replayed its epoch on a
second ``iter()`` trained every epoch on one order (litdata and MosaicML streaming move on).
"""

from __future__ import annotations

import itertools
import json

import pytest
from torch.utils.data import DataLoader

from loaders import TokenDataset, build_dataloader

SEQ, BATCH = 32, 64


def _loader(ds: str, **kw):  # type: ignore[no-untyped-def]
    return build_dataloader(ds, BATCH, SEQ, rank=0, world_size=1, seed=5,
                            return_sample_id=True, **kw)


def _pass(loader, limit: int | None = None) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [b["sample_id"].tolist() for b in itertools.islice(loader, limit)]


@pytest.fixture(scope="module")
def epochs(tiny_dataset: str) -> list[list[list[int]]]:
    """Epochs 0, 1 and 2, each chosen with ``set_epoch``."""
    ref = _loader(tiny_dataset)
    out = []
    for e in range(3):
        ref.set_epoch(e)
        out.append(_pass(ref))
    assert out[0] != out[1] != out[2]
    return out


@pytest.mark.parametrize("kw", [{}, {"num_workers": 2}, {"batch_thread": True}])
def test_iterating_again_reads_the_next_epoch(tiny_dataset: str, epochs, kw) -> None:  # noqa: ANN001
    loader = _loader(tiny_dataset, **kw)
    assert [_pass(loader) for _ in range(3)] == epochs
    assert loader.epoch == 2


def test_set_epoch_chooses_the_next_pass(tiny_dataset: str, epochs) -> None:  # noqa: ANN001
    loader = _loader(tiny_dataset)
    assert _pass(loader) == epochs[0]
    loader.set_epoch(0)  # the finished epoch again, from its start
    assert loader.remaining() == len(loader)
    assert _pass(loader) == epochs[0]
    loader.set_epoch(2)
    assert _pass(loader) == epochs[2]
    assert _pass(loader)[0] != epochs[2][0]  # then epoch 3


def test_a_pass_left_early_continues_then_moves_on(tiny_dataset: str, epochs) -> None:  # noqa: ANN001
    loader = _loader(tiny_dataset)
    head = _pass(loader, limit=5)
    loader.set_epoch(0)  # the epoch read in part: it continues
    assert head + _pass(loader) == epochs[0]
    assert _pass(loader) == epochs[1]


def test_a_state_from_anywhere_continues_the_same_batches(tiny_dataset: str, epochs) -> None:  # noqa: ANN001
    """States mid-epoch, at the end of a pass (before the next ``iter``), and after the first
    batch of the next epoch: a fresh loader given one reads, pass after pass, what the first
    read next (no empty pass at an epoch's end, no replay)."""
    n = len(epochs[0])
    flat = epochs[0] + epochs[1]
    for k in (3, n, n + 1):
        first = _loader(tiny_dataset)
        taken = _pass(first, limit=k)
        if k > n:
            taken += _pass(first, limit=k - n)
        assert taken == flat[:k]
        again = _loader(tiny_dataset, num_workers=2)
        again.load_state_dict(json.loads(json.dumps(first.state_dict())))
        got: list[list[int]] = []
        while len(got) < len(flat) - k:
            part = _pass(again)
            assert part, f"an empty pass after a state taken at batch {k}"
            got += part
        assert got[:len(flat) - k] == flat[k:], k


def _token_ids(loader) -> list[int]:  # type: ignore[no-untyped-def]
    return [x for b in loader for x in b["sample_id"].tolist()]


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_token_dataset_under_a_dataloader_moves_on(tiny_dataset: str, epochs, workers: int,  # noqa: ANN001
                                                   persistent: bool) -> None:
    """Each pass under a DataLoader is read by copies of the dataset (fresh ones for every
    pass unless persistent): the epochs their workers read whole are shared, so the next
    pass moves on all the same; ``set_epoch`` still chooses."""
    ds = TokenDataset(tiny_dataset, SEQ, rank=0, world_size=1, batch_size=BATCH, seed=5,
                      return_sample_id=True)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=workers,
                        persistent_workers=persistent)
    want = [[x for b in e for x in b] for e in epochs]
    assert _token_ids(loader) == want[0]
    assert _token_ids(loader) == want[1]
    if not persistent:  # persistent workers' copies never see the main process's set_epoch
        ds.set_epoch(0)
        assert _token_ids(loader) == want[0]


def test_token_dataset_state_after_a_whole_pass_moves_on(tiny_dataset: str, epochs) -> None:  # noqa: ANN001
    ds = TokenDataset(tiny_dataset, SEQ, rank=0, world_size=1, batch_size=BATCH, seed=5,
                      return_sample_id=True)
    ids = [int(x["sample_id"]) for x in ds]
    assert ids == [x for b in epochs[0] for x in b]
    again = TokenDataset(tiny_dataset, SEQ, rank=0, world_size=1, batch_size=BATCH, seed=5,
                         return_sample_id=True)
    again.load_state_dict(json.loads(json.dumps(ds.state_dict())))
    assert [int(x["sample_id"]) for x in again] == [x for b in epochs[1] for x in b]
