"""Checkpoints in one process: what is saved, that it is atomic and pruned, that loading is
safe, and that a resume from one continues bitwise the run it replaces (real loader, real
dataset, real DCP files; world size 1, no process group)."""

from __future__ import annotations

import json
import pickle
import random
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.checkpoint.checkpointer import (
    COMPLETE,
    Checkpointer,
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    set_rng_state,
)
from trainer.config import TrainConfig, resolve, resolve_batch
from trainer.data import EpochStream, build_loader
from trainer.distributed import DistInfo
from trainer.metrics import read_jsonl
from trainer.model import GPT, GPTConfig
from trainer.optim import build_optimizer
from trainer.train import train

SINGLE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def tiny_model() -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, max_seq_len=8, n_layers=1, d_model=16, n_heads=2))
    return model, build_optimizer(model, lr=1e-2, weight_decay=0.1)


def one_step(model: GPT, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 32, (2, 8), generator=g)
    _, loss = model(x, x)
    assert loss is not None
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_rng_states_round_trip_through_json() -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    state = json.loads(json.dumps(rng_state()))  # JSON, not pickle
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(9)
    np.random.seed(9)
    random.seed(9)
    set_rng_state(state)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0])
    assert np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def test_a_resume_walks_its_metadata_once(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_checkpoint`` checks ``.metadata`` itself and DCP reads it again: the opcode walk
    (minutes at the size cap) runs once for the same bytes; the load is still exact."""
    import trainer.checkpoint.safe_metadata as safe_metadata

    model, opt = tiny_model()
    one_step(model, opt, 1)
    Checkpointer(str(tmp_path / "ck")).save(1, model, opt, {})
    reads, walks = [0], [0]
    load, walk = safe_metadata.load_metadata, safe_metadata.check_pickle

    def counting_load(*args: object, **kwargs: object) -> object:
        reads[0] += 1
        return load(*args, **kwargs)  # type: ignore[arg-type]

    def counting_walk(*args: object, **kwargs: object) -> None:
        walks[0] += 1
        walk(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(safe_metadata, "check_pickle", counting_walk)
    monkeypatch.setattr("trainer.checkpoint.checkpointer.load_metadata", counting_load)
    monkeypatch.setattr(safe_metadata, "_PASSED", type(safe_metadata._PASSED)())
    fresh, fresh_opt = tiny_model()
    load_checkpoint(str(tmp_path / "ck" / "step-00000001"), fresh, fresh_opt)
    assert reads[0] >= 2 and walks[0] == 1, (reads, walks)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_save_load_keep_and_incomplete(tmp_path: Path) -> None:
    model, opt = tiny_model()
    ckpt = Checkpointer(str(tmp_path / "ck"), keep=2)
    for step in (1, 2, 3):
        one_step(model, opt, step)
        ckpt.save(step, model, opt, {"note": step})
    # keep=2: the oldest went; each survivor has its marker, trainer state and RNG file.
    assert [(s, c) for s, _, c in list_checkpoints(str(tmp_path / "ck"))] == [(2, True),
                                                                             (3, True)]
    step3 = tmp_path / "ck" / "step-00000003"
    assert {p.name for p in step3.iterdir()} >= {COMPLETE, "trainer.json", ".metadata", "rng"}
    assert json.loads((step3 / "trainer.json").read_text())["note"] == 3

    # A save killed before its marker: ignored by auto-resume, refused by an explicit load,
    # and pruned by the next save once it is older than the newest complete one.
    half = tmp_path / "ck" / "step-00000004"
    shutil.copytree(step3, half)
    (half / COMPLETE).unlink()
    assert latest_checkpoint(str(tmp_path / "ck")) == str(step3)
    fresh, fresh_opt = tiny_model()
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(str(half), fresh, fresh_opt)
    ckpt.save(5, model, opt, {"note": 5})
    assert [s for s, _, _ in list_checkpoints(str(tmp_path / "ck"))] == [3, 5]

    # Loading gives back exactly the saved model, optimizer moments and hyper-parameters.
    loaded = load_checkpoint(latest_checkpoint(str(tmp_path / "ck")), fresh, fresh_opt)
    assert loaded.step == 5 and loaded.trainer_state["note"] == 5 and loaded.rng_restored
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], fresh_opt.state[q][key]), key
    assert fresh_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


class _Boom:
    """Unpickling this calls ``Path.touch(target)``: code run by merely loading a file."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.target,))


def test_loading_refuses_pickled_code(tmp_path: Path) -> None:
    model, opt = tiny_model()
    ckpt = Checkpointer(str(tmp_path / "ck"))
    path = ckpt.save(1, model, opt, {})
    pwned = tmp_path / "pwned"
    (Path(path) / ".metadata").write_bytes(pickle.dumps(_Boom(pwned)))
    pickle.loads(pickle.dumps(_Boom(pwned)))  # the payload works when unpickled plainly...
    assert pwned.exists()
    pwned.unlink()
    with pytest.raises(CheckpointError, match="refusing to load"):  # ...but not through a load
        load_checkpoint(path, *tiny_model())
    assert not pwned.exists()


def test_async_save_is_complete_after_wait(tmp_path: Path) -> None:
    model, opt = tiny_model()
    ckpt = Checkpointer(str(tmp_path / "ck"), async_save=True)
    one_step(model, opt, 0)
    path = ckpt.save(1, model, opt, {})
    ckpt.wait()
    assert (Path(path) / COMPLETE).exists()
    fresh, fresh_opt = tiny_model()
    load_checkpoint(path, fresh, fresh_opt)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(),
                                                  strict=True))


def test_stream_state_at_an_epoch_end_moves_to_the_next_epoch(tiny_vocab_dataset: str) -> None:
    """A checkpoint taken right after an epoch's last batch must not replay that epoch."""
    def stream() -> EpochStream:
        return EpochStream(build_loader(tiny_vocab_dataset, batch_size=4, seq_len=32,
                                        num_workers=0, seed=0, rank=0, world_size=1,
                                        storage_options=None))

    a = stream()
    n = len(a.loader)
    for _ in range(n):
        a.next()
    state = json.loads(json.dumps(a.state_dict()))
    expected = a.next()  # first batch of epoch 1
    b = stream()
    b.load_state_dict(state)
    got = b.next()
    assert b.epoch == 1 and torch.equal(got["sample_id"], expected["sample_id"])


def config(data: str, run_dir: Path, **overrides: object) -> TrainConfig:
    base = dict(data=data, steps=10, batch_size=4, seq_len=32, layers=1, width=32, heads=2,
                lr=3e-3, warmup_steps=2, log_every=2, run_dir=str(run_dir), device="cpu",
                checkpoint_every=4, keep=5)
    base.update(overrides)
    cfg = resolve(TrainConfig(**base), "cpu", bf16_supported=False)  # type: ignore[arg-type]
    return resolve_batch(cfg, 1)


def run_in_process(cfg: TrainConfig) -> dict:
    assert cfg.batch_size is not None and cfg.seq_len is not None
    loader = build_loader(cfg.data, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                          num_workers=0, seed=cfg.seed, rank=0, world_size=1,
                          storage_options=None)
    return train(cfg, SINGLE, loader, 28, Path(cfg.run_dir or "."))


def test_resume_continues_bitwise(tiny_vocab_dataset: str, tmp_path: Path) -> None:
    """10 steps straight vs. 10 steps resumed from the step-4 checkpoint of another run
    (the dataset is 3 batches an epoch here: the resume lands mid-epoch 1)."""
    straight = config(tiny_vocab_dataset, tmp_path / "a", checkpoint_dir=str(tmp_path / "ck"),
                      deterministic=True)
    run_in_process(straight)
    assert [s for s, _, c in list_checkpoints(str(tmp_path / "ck")) if c] == [4, 8, 10]

    # The resumed run starts in a run dir holding a killed run's logs up to step 6.
    shutil.copytree(tmp_path / "ck" / "step-00000004", tmp_path / "ck2" / "step-00000004")
    (tmp_path / "b").mkdir()
    for name in ("metrics.jsonl", "rank0_samples.jsonl"):
        lines = (tmp_path / "a" / name).read_text().splitlines(keepends=True)
        keep = [ln for ln in lines if json.loads(ln)["step"] <= 6]
        (tmp_path / "b" / name).write_text("".join(keep))
    resumed = replace(straight, run_dir=str(tmp_path / "b"), checkpoint_dir=str(tmp_path / "ck2"))
    run_in_process(resumed)

    a = torch.load(tmp_path / "a" / "model_final.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model_final.pt", weights_only=True)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ"
    # Logs: appended, the killed run's steps after the checkpoint replaced, not duplicated.
    for name in ("metrics.jsonl", "rank0_samples.jsonl"):
        ra, rb = read_jsonl(tmp_path / "a" / name), read_jsonl(tmp_path / "b" / name)
        assert [r["step"] for r in rb] == [r["step"] for r in ra]
    sa = read_jsonl(tmp_path / "a" / "rank0_samples.jsonl")
    sb = read_jsonl(tmp_path / "b" / "rank0_samples.jsonl")
    assert [r["sample_ids"] for r in sa] == [r["sample_ids"] for r in sb]
    ma, mb = read_jsonl(tmp_path / "a" / "metrics.jsonl"), read_jsonl(tmp_path / "b" /
                                                                        "metrics.jsonl")
    assert ma[-1]["loss"] == mb[-1]["loss"]
    # The loader's read counters ride along in every record; MFU only where a peak is known.
    for r in ma + mb:
        assert r["loader_bytes_read"] > 0 and r["loader_samples_per_s"] > 0, r
        assert r["loader_failovers"] == 0 and r["loader_wait_s"] >= 0
        assert r["mfu"] is None


def test_resume_refuses_another_global_batch(tiny_vocab_dataset: str, tmp_path: Path) -> None:
    from trainer.config import ConfigError

    first = config(tiny_vocab_dataset, tmp_path / "a", steps=4,
                   checkpoint_dir=str(tmp_path / "ck"))
    run_in_process(first)
    other = config(tiny_vocab_dataset, tmp_path / "b", steps=6, batch_size=2,
                   checkpoint_dir=str(tmp_path / "ck"))
    with pytest.raises(ConfigError, match="global_batch_size=4"):
        run_in_process(other)


@pytest.mark.slow
def test_checkpoints_on_s3(s3_bucket) -> None:
    """The fsspec path: DCP's FsspecWriter/Reader on a real S3 server, marker and pruning
    through s3fs."""
    url = f"{s3_bucket.url}/ckpt"
    opts = s3_bucket.storage_options
    model, opt = tiny_model()
    ckpt = Checkpointer(url, keep=1, storage_options=opts)
    one_step(model, opt, 0)
    ckpt.save(1, model, opt, {"where": "s3"})
    one_step(model, opt, 1)
    ckpt.save(2, model, opt, {"where": "s3"})
    assert [(s, c) for s, _, c in list_checkpoints(url, opts)] == [(2, True)]
    fresh, fresh_opt = tiny_model()
    loaded = load_checkpoint(latest_checkpoint(url, opts), fresh, fresh_opt, opts)
    assert loaded.step == 2 and loaded.trainer_state["where"] == "s3"
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(),
                                                  strict=True))
