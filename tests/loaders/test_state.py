"""Exact resume: state_dict()/load_state_dict() across workers, world sizes and epochs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

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
    assert (state["epoch"], state["lane_pos"], state["into_step"]) == (0, 5, 0)
    assert state["plan"]["lanes"] == 4


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


def _global_batches(ds: str, global_batch: int, world: int, workers: int = 0,
                    state: dict | None = None, limit: int | None = None, epoch: int = 0
                    ) -> tuple[list[list[int]], dict]:
    """Global batches (each the sorted union of the ranks' batches) as ``world`` ranks of
    ``workers`` DataLoader workers each produce them, from ``state`` when given."""
    loaders = [_loader(ds, global_batch // world, rank=r, world=world, workers=workers)
               for r in range(world)]
    per_rank = []
    for ld in loaders:
        ld.set_epoch(epoch)
        if state is not None:
            ld.load_state_dict(state)
        per_rank.append([b["sample_id"].tolist() for b in itertools.islice(ld, limit)])
    assert len({len(b) for b in per_rank}) == 1  # equal batch counts on every rank
    states = [ld.state_dict() for ld in loaders]
    assert all(s == states[0] for s in states)  # the same state on every rank
    return [sorted(x for r in range(world) for x in per_rank[r][k])
            for k in range(len(per_rank[0]))], states[0]


@pytest.mark.parametrize("world,workers", [(2, 0), (4, 0), (2, 2), (4, 1)])
def test_global_batches_are_the_same_on_1_2_and_4_ranks(tiny_dataset: str, world: int,
                                                         workers: int) -> None:
    """The elastic rule end to end (real dataset, real reads): at one global batch, every
    global batch is the same set of samples whatever the world size and num_workers."""
    ref, _ = _global_batches(tiny_dataset, 8, 1, epoch=1)
    got, _ = _global_batches(tiny_dataset, 8, world, workers, epoch=1)
    assert got == ref
    assert len(ref) > 10 and all(len(b) == 8 for b in ref[:-1])


@pytest.mark.parametrize("before,after", [((1, 0), (4, 0)), ((4, 0), (2, 2)), ((2, 1), (1, 2))])
def test_resume_on_another_world_size_continues_the_same_global_batches(
        tiny_dataset: str, before: tuple[int, int], after: tuple[int, int]) -> None:
    ref, _ = _global_batches(tiny_dataset, 8, 1)
    head, state = _global_batches(tiny_dataset, 8, *before, limit=5)
    tail, _ = _global_batches(tiny_dataset, 8, *after, state=json.loads(json.dumps(state)))
    assert head == ref[:5] and tail == ref[5:]


@pytest.mark.parametrize("new_world", [1, 3])
def test_elastic_resume_at_same_global_batch(tiny_dataset: str, new_world: int) -> None:
    """2 ranks x batch 6 stop after 4 steps; resume on 1 rank x 12 or 3 ranks x 4."""
    global_batch = 12
    ref, _ = _global_batches(tiny_dataset, global_batch, 1)
    head, state = _global_batches(tiny_dataset, global_batch, 2, limit=4)
    rest, _ = _global_batches(tiny_dataset, global_batch, new_world, state=state)
    assert head + rest == ref
    seen = [x for b in head + rest for x in b]
    n = build_dataloader(tiny_dataset, 4, SEQ).source.n_samples
    assert set(seen) == set(range(n))
    assert len(seen) - n < global_batch  # only padding repeats (at most one per lane)


def test_accumulation_states_resume_mid_step_only_on_the_same_layout(tiny_dataset: str) -> None:
    """With a global batch of 8 on 2 ranks of micro-batch 2, a state after 3 micro-batches
    is mid-step: the same layout continues it exactly, another one refuses it."""
    def make(world: int, batch: int, rank: int = 0):  # type: ignore[no-untyped-def]
        return _loader(tiny_dataset, batch, rank=rank, world=world, global_batch_size=8)

    full = _ids(make(2, 2))
    first = make(2, 2)
    head = _ids(first, limit=3)
    state = first.state_dict()
    assert state["into_step"] == 2 and state["mid_step_layout"] == [2, 2]  # 1 step + 2
    same = make(2, 2)
    same.load_state_dict(state)
    assert head + _ids(same) == full
    with pytest.raises(LoaderStateError, match="global batch boundary"):
        make(4, 2).load_state_dict(state)


def test_state_from_another_plan_is_refused(tiny_dataset: str) -> None:
    state = _loader(tiny_dataset, 4).state_dict()
    other = build_dataloader(tiny_dataset, 4, SEQ + 1, rank=0, world_size=1)
    with pytest.raises(LoaderStateError, match="seq_len: saved 32, now 33"):
        other.load_state_dict(state)


def test_run_blocks_is_part_of_the_plan_and_absent_means_one(tiny_dataset: str) -> None:
    """``run_blocks`` changes the order, so a state carries it; it is recorded only when not
    1, so states saved before it existed mean 1. A value set on purpose refuses a state on
    another one, both ways; left unset, a loader takes the state's (its tiny dataset alone
    would choose 1) and continues that order exactly."""
    plain = _loader(tiny_dataset, 4, run_blocks=1)
    _ids(plain, limit=2)
    old_style = plain.state_dict()
    assert "run_blocks" not in old_style["plan"]
    assert "run_blocks" not in _loader(tiny_dataset, 4).state_dict()["plan"]  # auto: 1 here
    runs = _loader(tiny_dataset, 4, run_blocks=3)
    with pytest.raises(LoaderStateError, match="run_blocks: saved 1, now 3"):
        runs.load_state_dict(old_style)
    _ids(runs, limit=2)
    state = runs.state_dict()
    assert state["plan"]["run_blocks"] == 3
    with pytest.raises(LoaderStateError, match="run_blocks: saved 3, now 1"):
        _loader(tiny_dataset, 4, run_blocks=1).load_state_dict(state)
    whole = _ids(_loader(tiny_dataset, 4, run_blocks=3))
    for kw in ({"run_blocks": 3}, {}):  # set to the state's value, or left to it
        fresh = _loader(tiny_dataset, 4, **kw)
        fresh.load_state_dict(json.loads(json.dumps(state)))
        assert fresh.state_dict()["plan"]["run_blocks"] == 3
        assert _ids(fresh) == whole[8:]
    # a hostile state's run longer than the dataset is refused, not planned (its padded
    # domain would be a billion empty slots to scan)
    hostile = {**state, "plan": {**state["plan"], "run_blocks": 10**9}}
    with pytest.raises(LoaderStateError, match="run_blocks: saved 1000000000, now 1"):
        _loader(tiny_dataset, 4).load_state_dict(hostile)
    # the same samples as single blocks, in another order
    default = _ids(_loader(tiny_dataset, 4))
    assert set(whole) == set(default) and whole != default  # (padding repeats may differ)
    with pytest.raises(ValueError, match="run_blocks must be >= 1"):
        _loader(tiny_dataset, 4, run_blocks=0)


@pytest.fixture(scope="module")
def fine_dataset(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> str:
    """The tiny corpus in row groups of 512 tokens (~200): enough of them for the default
    ``run_blocks`` to choose runs (at 4 lanes: 2 from 128 row groups, 4 from 256)."""
    from pipeline.config import PipelineConfig
    from pipeline.driver.job import run

    out = tmp_path_factory.mktemp("datasets") / "fine"
    run(PipelineConfig(inputs=[str(corpus_dir / "*.txt")], output=str(out), workers=2,
                       dashboard_address="127.0.0.1:0", row_group_tokens=512),
        progress=False)
    return str(out)


def test_default_runs_on_a_larger_dataset_and_old_states_keep_their_order(
        fine_dataset: str) -> None:
    """Left unset, ``run_blocks`` is chosen from the row groups and lanes (recorded in the
    state); a state saved with single blocks (before runs were the default: no key) resumes
    on single blocks, exactly; a state from an unset plan resumes on the same runs."""
    from loaders.plan import auto_run_blocks

    auto = _loader(fine_dataset, 4)
    groups = len(auto.source.plan.group_samples)
    k = auto_run_blocks(groups, 4)
    assert k >= 2, groups  # the fixture is large enough for runs
    assert auto.state_dict()["plan"]["run_blocks"] == k
    assert _ids(auto) == _ids(_loader(fine_dataset, 4, run_blocks=k))
    singles = _ids(_loader(fine_dataset, 4, run_blocks=1))
    assert singles != _ids(_loader(fine_dataset, 4))

    older = _loader(fine_dataset, 4, run_blocks=1)
    _ids(older, limit=3)
    saved = json.loads(json.dumps(older.state_dict()))
    assert "run_blocks" not in saved["plan"]  # what every state before the default had
    resumed = _loader(fine_dataset, 4)
    resumed.load_state_dict(saved)
    assert "run_blocks" not in resumed.state_dict()["plan"]
    assert _ids(resumed) == singles[12:]

    started = _loader(fine_dataset, 4)
    first = _ids(started, limit=3)
    again = _loader(fine_dataset, 4)
    again.load_state_dict(json.loads(json.dumps(started.state_dict())))
    assert first + _ids(again) == _ids(_loader(fine_dataset, 4))
    # a state recorded under another default (the cap on runs was 16 before 64) resumes its
    # own runs, not the ones the current default resolves to
    other = _loader(fine_dataset, 4, run_blocks=2 * k)
    head = _ids(other, limit=3)
    moved = _loader(fine_dataset, 4)
    moved.load_state_dict(json.loads(json.dumps(other.state_dict())))
    assert moved.state_dict()["plan"]["run_blocks"] == 2 * k
    assert head + _ids(moved) == _ids(_loader(fine_dataset, 4, run_blocks=2 * k))
    assert _ids(_loader(fine_dataset, 4, run_blocks=2 * k)) != _ids(_loader(fine_dataset, 4))
    # a refused state leaves the loader as it was: still its own default plan
    bad = {**saved, "plan": {**saved["plan"], "seq_len": SEQ + 1}}
    fresh = _loader(fine_dataset, 4)
    with pytest.raises(LoaderStateError, match="seq_len"):
        fresh.load_state_dict(bad)
    assert fresh.state_dict()["plan"]["run_blocks"] == k
