"""The trainer's side of the data: the loader it builds from its flags."""

from __future__ import annotations

from pathlib import Path

from loaders.cache import DEFAULT_CACHE_BYTES
from trainer.data import build_loader


def _build(url: str, **kw):  # type: ignore[no-untyped-def]
    return build_loader(url, batch_size=4, seq_len=32, num_workers=0, seed=0, rank=0,
                        world_size=1, storage_options=None, **kw)


def test_cache_flags_reach_the_loader(tiny_dataset: str, tmp_path: Path) -> None:
    plain = _build(tiny_dataset).source.settings.read
    assert plain.cache_dir is None and plain.cache_bytes == DEFAULT_CACHE_BYTES
    cached = _build(tiny_dataset, cache_dir=str(tmp_path), cache_bytes=1 << 20)
    assert cached.source.settings.read.cache_bytes == 1 << 20
    next(iter(cached))
    assert cached.metrics()["cache_misses"] > 0 and any(tmp_path.iterdir())


def test_readahead_flag_reaches_the_loader(tiny_dataset: str) -> None:
    from loaders.coalesce import READAHEAD_BYTES
    from trainer.config import parse_args

    assert _build(tiny_dataset).source.settings.read.readahead_bytes == READAHEAD_BYTES
    cfg = parse_args(["--data", tiny_dataset, "--readahead-bytes", "64M"])
    assert cfg.readahead_bytes == 64 << 20
    loader = _build(tiny_dataset, readahead_bytes=cfg.readahead_bytes)
    assert loader.source.settings.read.readahead_bytes == 64 << 20


def test_the_loader_is_stateful_and_the_stream_saves_it(tiny_dataset: str) -> None:
    from torch.distributed.checkpoint.stateful import Stateful

    from trainer.data import EpochStream

    loader = _build(tiny_dataset, global_batch_size=8)  # micro-batch 4, accumulation 2
    assert isinstance(loader, Stateful)
    stream = EpochStream(loader)
    ids = [stream.next()["sample_id"].tolist() for _ in range(3)]
    state = stream.state_dict()
    assert state["loader"]["lane_pos"] == 1 and state["loader"]["into_step"] == 4
    again = EpochStream(_build(tiny_dataset, global_batch_size=8))
    again.load_state_dict(state)
    fresh = EpochStream(_build(tiny_dataset, global_batch_size=8))
    want = [fresh.next()["sample_id"].tolist() for _ in range(5)]
    assert ids + [again.next()["sample_id"].tolist() for _ in range(2)] == want


def test_run_blocks_flag_reaches_the_plan(tiny_dataset: str) -> None:
    from trainer.config import TrainConfig

    assert TrainConfig.__dataclass_fields__["run_blocks"].default is None  # auto
    runs = _build(tiny_dataset, run_blocks=3)
    assert runs.source.settings.plan.run_blocks == 3
    assert runs.state_dict()["plan"]["run_blocks"] == 3
    assert "run_blocks" not in _build(tiny_dataset).state_dict()["plan"]
