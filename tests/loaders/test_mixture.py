"""Weighted mixtures: exact proportions per epoch, determinism, resume; scheduled weights:
every interval's share, resume mid-ramp on another world size, components switched off."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from loaders.mixture import MixtureSource, build_mixture_loader, component_counts
from loaders.mixture_schedule import Schedule, scheduled_shares
from loaders.settings import LoaderSettings
from loaders.source import DatasetSource
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


# -- scheduled mixtures: weights that change by step --------------------------------------------

RAMP = Schedule.of([(0, [9.0, 1.0]), (1000, [1.0, 1.0])], "linear")  # 90/10 -> 50/50


def _scheduled(ds: str, schedule: Schedule = RAMP, *, rank: int = 0, world: int = 1,
               global_batch: int = 8, **kw):
    return build_mixture_loader([ds, ds], global_batch // world, SEQ, schedule=schedule,
                                rank=rank, world_size=world, global_batch_size=global_batch,
                                return_sample_id=True, **kw)


def _global_batches(loaders: list, steps: int) -> list[dict[str, torch.Tensor]]:
    """``steps`` global batches of a job whose ranks are ``loaders`` (rank order), across
    epochs as the trainer reads them (iterating again reads the next epoch)."""
    its = [iter(x) for x in loaders]
    out = []
    while len(out) < steps:
        try:
            parts = [next(it) for it in its]
        except StopIteration:
            its = [iter(x) for x in loaders]
            continue
        out.append({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
    return out


def test_a_one_point_schedule_is_the_fixed_mixture(tiny_dataset: str) -> None:
    fixed = _loader(tiny_dataset, samples_per_epoch=240)
    one = build_mixture_loader([tiny_dataset, tiny_dataset], 8, SEQ, rank=0, world_size=1,
                               return_sample_id=True, samples_per_epoch=240,
                               schedule=Schedule.of([(0, [3.0, 1.0])]))
    assert _ids(one) == _ids(fixed)
    assert one.state_dict() == fixed.state_dict()


def test_a_ramp_realises_every_million_tokens_share(tiny_dataset: str) -> None:
    """90/10 to 50/50 over 1,000 steps of 256 sequences of 128 tokens (33.6 M tokens, the plan
    of real datasets, no token read): every 31 steps (1.02 M tokens) has its scheduled share to
    within 1 % (in fact to a few samples)."""
    seq, batch = 128, 256
    components = [DatasetSource(tiny_dataset, LoaderSettings.from_kwargs(seq, seed=i))
                  for i in range(2)]
    mix = MixtureSource(components, RAMP, step_samples=batch, samples_per_epoch=batch * 100)
    lanes = batch  # the default: one sample per lane per step
    steps = [mix.lane_samples(e, lanes, 0, lanes).T for e in range(10)]  # [step, lane]
    ids = np.concatenate(steps)
    assert ids.shape == (1000, batch)
    first = mix.source_of(ids) == 0
    for a in range(0, 1000, 31):
        b = min(a + 31, 1000)
        realised = first[a:b].mean()
        scheduled = scheduled_shares(RAMP, a, b)[0]
        assert abs(realised - scheduled) < 0.01, (a, realised, scheduled)
        assert abs(realised - scheduled) * (b - a) * batch <= 4  # within four samples
    assert first[:31].mean() > 0.88 and first[-31:].mean() < 0.52


def test_a_resume_mid_ramp_on_another_world_size_gives_the_same_batches(
        tiny_dataset: str) -> None:
    """Two ranks to step 500 of the ramp (in the middle of an epoch: 60 steps each), the state
    saved, four ranks from there: bitwise the global batches of one uninterrupted rank, which
    realise every 100 steps' scheduled share to within 1 %."""
    kw = {"samples_per_epoch": 480}
    reference = _global_batches([_scheduled(tiny_dataset, **kw)], 1000)
    two = [_scheduled(tiny_dataset, rank=r, world=2, **kw) for r in range(2)]
    before = _global_batches(two, 500)
    state = two[0].state_dict()
    assert state == two[1].state_dict() and state["epoch"] == 8
    assert state["lane_pos"] == 20  # 500 = 8 epochs of 60 steps + 20
    four = [_scheduled(tiny_dataset, rank=r, world=4, **kw) for r in range(4)]
    for loader in four:
        loader.load_state_dict(state)
    after = _global_batches(four, 500)
    for want, got in zip(reference, before + after, strict=True):
        for key in ("input_ids", "labels", "sample_id"):
            assert torch.equal(want[key], got[key])
    mix = four[0].source
    first = np.stack([mix.source_of(b["sample_id"].numpy()) == 0 for b in reference])
    for a in range(0, 1000, 100):
        assert abs(first[a:a + 100].mean() - scheduled_shares(RAMP, a, a + 100)[0]) < 0.01


def test_workers_give_the_same_scheduled_batches(tiny_dataset: str) -> None:
    kw = {"samples_per_epoch": 480}
    inline = _global_batches([_scheduled(tiny_dataset, **kw)], 70)
    forked = _scheduled(tiny_dataset, num_workers=2, **kw)
    workers = _global_batches([forked], 70)
    assert forked.num_workers == 2
    assert all(torch.equal(a["input_ids"], b["input_ids"])
               for a, b in zip(inline, workers, strict=True))


def test_a_component_that_is_off_is_not_read(tiny_dataset: str) -> None:
    """Weight 0 until step 50 ("step" ramp): no sample of it before, its share after."""
    off = Schedule.of([(0, [1.0, 0.0]), (50, [1.0, 1.0])], "step")
    loader = _scheduled(tiny_dataset, off, samples_per_epoch=4000)
    batches = _global_batches([loader], 150)
    source = np.stack([loader.source.source_of(b["sample_id"].numpy()) for b in batches])
    assert (source[:50] == 0).all()
    assert (source[50:] == 1).mean() == pytest.approx(0.5, abs=0.01)


def test_a_state_of_another_schedule_is_refused(tiny_dataset: str) -> None:
    loader = _scheduled(tiny_dataset, samples_per_epoch=480)
    _ids(loader, limit=3)
    state = loader.state_dict()
    assert state["plan"]["schedule"] == RAMP.identity() and state["plan"]["step_samples"] == 8
    other = Schedule.of([(0, [9.0, 1.0]), (2000, [1.0, 1.0])], "linear")
    with pytest.raises(LoaderStateError, match="schedule: saved"):
        _scheduled(tiny_dataset, other, samples_per_epoch=480).load_state_dict(state)
    with pytest.raises(LoaderStateError, match="step_samples: saved 8, now 16"):
        _scheduled(tiny_dataset, samples_per_epoch=480, global_batch=16).load_state_dict(state)


def test_scheduled_mixture_arguments_are_checked(tiny_dataset: str) -> None:
    with pytest.raises(ValueError, match="pass global_batch_size"):
        build_mixture_loader([tiny_dataset, tiny_dataset], 8, SEQ, schedule=RAMP)
    with pytest.raises(ValueError, match="URLs only"):
        build_mixture_loader([(tiny_dataset, 1.0), (tiny_dataset, 1.0)], 8, SEQ,
                             schedule=RAMP, global_batch_size=8)
    with pytest.raises(ValueError, match="one weight per component"):
        build_mixture_loader([tiny_dataset], 8, SEQ, schedule=RAMP, global_batch_size=8)
    components = [DatasetSource(tiny_dataset, LoaderSettings.from_kwargs(SEQ))] * 2
    with pytest.raises(ValueError, match="give step_samples"):
        MixtureSource(components, RAMP)
    with pytest.raises(ValueError, match="8 lanes do not divide the mixture's steps of 12"):
        MixtureSource(components, RAMP, step_samples=12).lane_length(8)
