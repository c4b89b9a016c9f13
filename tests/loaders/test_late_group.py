"""A loader not told its rank takes it when it needs it, from the process group made since,
and refuses, in one line naming WORLD_SIZE, while a job of several processes has none yet:
read as rank 0 of 1, every process would get the same data. Two real processes are in
``test_frameworks.py`` (``torch_late_group``); here one process and its environment."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from loaders import TokenDataset, build_dataloader
from loaders.state import LoaderStateError
from loaders.world import WorldNotReadyError

SEQ, BATCH = 32, 8


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    """Makes a process group of one (gloo) when called; destroyed after the test."""
    made: list[bool] = []

    def make() -> None:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                                world_size=1)
        made.append(True)

    yield make  # type: ignore[misc]
    if made:
        dist.destroy_process_group()


def _ids(loader, limit: int | None = None) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [b["sample_id"].tolist() for b in itertools.islice(loader, limit)]


def test_refused_in_one_line_naming_world_size(tiny_dataset: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = build_dataloader(tiny_dataset, BATCH, SEQ)  # building needs no rank
    ds = TokenDataset(tiny_dataset, SEQ, batch_size=BATCH)
    for ask in (lambda: iter(loader), lambda: len(loader), loader.remaining,
                loader.state_dict, lambda: iter(ds), lambda: len(ds)):
        with pytest.raises(WorldNotReadyError) as err:
            ask()
        message = str(err.value)
        assert "WORLD_SIZE=2" in message and "rank=" in message and "\n" not in message
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: rank 0 of 1, as before
    assert len(loader) == len(build_dataloader(tiny_dataset, BATCH, SEQ, rank=0,
                                               world_size=1))


def test_a_state_loaded_before_the_group_waits_for_it(tiny_dataset: str, group,  # noqa: ANN001
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    first = build_dataloader(tiny_dataset, BATCH, SEQ, rank=0, world_size=1,
                             return_sample_id=True)
    head = _ids(first, limit=3)
    state = first.state_dict()
    rest = _ids(first)
    monkeypatch.setenv("WORLD_SIZE", "2")
    resumed = build_dataloader(tiny_dataset, BATCH, SEQ, return_sample_id=True)
    resumed.load_state_dict(state)  # no group yet: kept, checked once it exists
    assert resumed.state_dict() == state and resumed.epoch == 0
    wrong = build_dataloader(tiny_dataset, BATCH * 2, SEQ)  # another plan (16 lanes)
    wrong.load_state_dict(state)
    with pytest.raises(WorldNotReadyError):
        iter(resumed)
    group()  # a group of one: the process group, not the environment, decides
    assert resumed.layout.world_size == 1
    assert head and _ids(resumed) == rest
    for _ in range(2):  # refused, and again: not read on from a position it does not fit
        with pytest.raises(LoaderStateError, match="lanes: saved 8, now 16"):
            iter(wrong)
