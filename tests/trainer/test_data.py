"""The trainer's side of the data: the loader it builds from its flags."""

from __future__ import annotations

from pathlib import Path

from loaders.cache import DEFAULT_CACHE_BYTES
from trainer.data import build_loader


def _build(url: str, **kw):  # type: ignore[no-untyped-def]
    return build_loader(url, batch_size=4, seq_len=32, num_workers=0, seed=0, rank=0,
                        world_size=1, storage_options=None, **kw)


def test_cache_flags_reach_the_loader(tiny_dataset: str, tmp_path: Path) -> None:
    plain = _build(tiny_dataset)
    assert plain.dataset.cache_dir is None and plain.dataset.cache_bytes == DEFAULT_CACHE_BYTES
    cached = _build(tiny_dataset, cache_dir=str(tmp_path), cache_bytes=1 << 20)
    assert cached.dataset.cache_bytes == 1 << 20
    next(iter(cached))
    assert cached.metrics()["cache_misses"] > 0 and any(tmp_path.iterdir())
