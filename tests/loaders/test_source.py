"""The Source protocol says everything the loader uses, and TokenDataset reads the same stream
as ``build_dataloader``'s loader."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from loaders import TokenDataset, build_dataloader
from loaders.mixture import MixtureSource
from loaders.settings import LoaderSettings
from loaders.source import DatasetSource, Source

SEQ = 32


def _protocol_members() -> set[str]:
    members = {n for n in vars(Source) if not n.startswith("_")}
    members |= set(inspect.get_annotations(Source))
    return members


def test_dataset_and_mixture_implement_every_member(tiny_dataset: str) -> None:
    settings = LoaderSettings(SEQ)
    one = DatasetSource(tiny_dataset, settings)
    mix = MixtureSource([one, DatasetSource(tiny_dataset, settings)], [1.0, 2.0])
    for source in (one, mix):
        assert isinstance(source, Source)
        missing = {m for m in _protocol_members() if not hasattr(source, m)}
        assert not missing, f"{type(source).__name__} lacks {missing}"
    assert mix.tokenizer_sha256 == one.tokenizer_sha256 == one.manifest.tokenizer.sha256


def test_lane_plan_columns_equal_lane_samples(tiny_dataset: str) -> None:
    settings = LoaderSettings(SEQ)
    one = DatasetSource(tiny_dataset, settings)
    mix = MixtureSource([one, DatasetSource(tiny_dataset, LoaderSettings(SEQ))], [1.0, 1.0])
    for source in (one, mix):
        whole = source.lane_samples(1, 8, 2, 6)
        cols = source.lane_plan(1, 8, 2, 6)
        m = whole.shape[1]
        got = np.concatenate([cols.columns(c, min(c + 5, m)) for c in range(0, m, 5)], axis=1)
        assert np.array_equal(got, whole)


def test_windows_close_stops_a_mixture_and_its_components(tiny_dataset: str) -> None:
    settings = LoaderSettings(SEQ)
    mix = MixtureSource([DatasetSource(tiny_dataset, settings),
                         DatasetSource(tiny_dataset, settings)], [1.0, 1.0])
    samples = mix.lane_samples(0, 4, 0, 4).ravel()[:40]
    it = iter(mix.windows(samples))
    assert len(next(it)) == SEQ + 1
    it.close()
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("workers", [0, 2])
def test_token_dataset_streams_the_loaders_order(tiny_dataset: str, workers: int) -> None:
    """Same rank stream: the samples TokenDataset yields (through a torch DataLoader with
    ``workers`` workers) are, batch by batch, the loader's."""
    batch = 4
    loader = build_dataloader(tiny_dataset, batch, SEQ, rank=1, world_size=2, seed=5,
                              return_sample_id=True)
    want = [b["sample_id"].tolist() for b in loader]
    ds = TokenDataset(tiny_dataset, SEQ, rank=1, world_size=2, batch_size=batch, seed=5,
                      return_sample_id=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers)
    got = [b["sample_id"].tolist() for b in dl]
    assert got == want
    assert ds.rank_order().tolist() == [s for b in want for s in b]


def test_token_dataset_resumes_mid_piece(tiny_dataset: str, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    """A resume skips what was yielded, also across the stream's pieces."""
    from loaders import plan

    monkeypatch.setattr(plan, "STREAM_CHUNK", 8)  # many pieces on the tiny dataset
    ds = TokenDataset(tiny_dataset, SEQ, rank=0, world_size=1, batch_size=4,
                      return_sample_id=True)
    full = [int(x["sample_id"]) for x in ds]
    ds.set_epoch(0)  # the same epoch again: iterating again would read the next
    it = iter(ds)
    head = [int(next(it)["sample_id"]) for _ in range(21)]
    state = ds.state_dict()
    again = TokenDataset(tiny_dataset, SEQ, rank=0, world_size=1, batch_size=4,
                         return_sample_id=True)
    again.load_state_dict(state)
    assert head + [int(x["sample_id"]) for x in again] == full
