"""Weighted mixtures: exact proportions per epoch, determinism, resume."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loaders.mixture import build_mixture_loader, component_counts
from loaders.state import LoaderStateError

SEQ = 32


@given(st.lists(st.floats(0.01, 100), min_size=1, max_size=6), st.integers(0, 10_000))
def test_counts_add_up_and_follow_the_weights(weights: list[float], total: int) -> None:
    counts = component_counts(weights, total)
    exact = np.asarray(weights) / sum(weights) * total
    assert counts.sum() == total
    assert (np.abs(counts - exact) < 1).all()


def _loader(ds: str, **kw):
    return build_mixture_loader([(ds, 3.0), (ds, 1.0)], 8, SEQ, rank=kw.pop("rank", 0),
                                world_size=kw.pop("world", 1), return_sample_id=True, **kw)


def _ids(loader, limit: int | None = None) -> list[int]:
    return [i for b in itertools.islice(loader, limit) for i in b["sample_id"].tolist()]


def test_epoch_has_exact_proportions_and_no_repeats(tiny_dataset: str) -> None:
    loader = _loader(tiny_dataset, samples_per_epoch=400)
    ids = np.array(_ids(loader))
    mix = loader.source
    source = mix.source_of(ids)
    assert len(ids) == 400
    assert (np.bincount(source) == [300, 100]).all()
    assert len(set(ids.tolist())) == 400  # no sample twice within an epoch
    assert _ids(_loader(tiny_dataset, samples_per_epoch=400)) == ids.tolist()  # determinism
    loader.set_epoch(1)
    assert _ids(loader) != ids.tolist()


def test_mixture_resumes_exactly_and_splits_over_ranks(tiny_dataset: str) -> None:
    full = [_ids(_loader(tiny_dataset, samples_per_epoch=240, rank=r, world=2))
            for r in range(2)]
    first = _loader(tiny_dataset, samples_per_epoch=240)
    one_rank = _ids(first, limit=3)
    resumed = _loader(tiny_dataset, samples_per_epoch=240)
    resumed.load_state_dict(first.state_dict())
    assert one_rank + _ids(resumed) == _ids(_loader(tiny_dataset, samples_per_epoch=240))
    assert not set(full[0]) & set(full[1])  # two ranks: disjoint halves
    assert len(full[0]) == len(full[1]) == 120


def test_a_mixture_resumes_each_component_on_its_saved_run_blocks(tiny_dataset: str) -> None:
    """Components left on the default take their saved ``run_blocks`` at a resume (one per
    component); one set on purpose refuses another value."""
    set_ = _loader(tiny_dataset, samples_per_epoch=240, run_blocks=3)
    first = _ids(set_, limit=2)
    state = set_.state_dict()
    assert [c["run_blocks"] for c in state["plan"]["components"]] == [3, 3]
    unset = _loader(tiny_dataset, samples_per_epoch=240)
    unset.load_state_dict(state)
    assert unset.state_dict()["plan"] == state["plan"]
    assert first + _ids(unset) == _ids(_loader(tiny_dataset, samples_per_epoch=240,
                                               run_blocks=3))
    with pytest.raises(LoaderStateError, match=r"'run_blocks': 3}\], now .*'run_blocks': 2}"):
        _loader(tiny_dataset, samples_per_epoch=240, run_blocks=2).load_state_dict(state)
