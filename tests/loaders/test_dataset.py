"""The streaming dataset over a real pipeline-made dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from loaders import TokenDataset, build_dataloader
from storage import read_manifest, shards_of, tokens

SEQ = 64


def _stream(dataset: str) -> np.ndarray:
    """The whole token stream, read straight from the shards in manifest order."""
    m = read_manifest(dataset)
    parts = [tokens.unpack(pq.read_table(Path(dataset) / s.path).column("input_ids"),
                           m.schema["input_ids"]) for s in shards_of(dataset, m)]
    return np.concatenate(parts).astype(np.int64)


def _collect(dataset: str, rank: int, world: int, workers: int, epoch: int = 0,
             batch: int = 4) -> tuple[list[int], list[torch.Tensor]]:
    loader = build_dataloader(dataset, batch, SEQ, num_workers=workers, rank=rank,
                              world_size=world, return_sample_id=True)
    loader.set_epoch(epoch)
    ids, windows = [], []
    for b in loader:
        assert b["input_ids"].dtype == torch.long and b["input_ids"].shape[1] == SEQ
        assert torch.equal(b["input_ids"][:, 1:], b["labels"][:, :-1])
        ids += b["sample_id"].tolist()
        windows += list(torch.cat([b["input_ids"], b["labels"][:, -1:]], dim=1))
    return ids, windows


def _grid(dataset: str) -> list[int]:
    """Start of every sample, derived from the manifest alone: whole windows per row group."""
    starts, offset = [], 0
    for shard in shards_of(dataset, read_manifest(dataset)):
        for g in shard.row_groups:
            starts += range(offset, offset + (g.tokens // (SEQ + 1)) * (SEQ + 1), SEQ + 1)
            offset += g.tokens
    return starts


def test_two_ranks_two_workers_cover_the_stream(tiny_dataset: str) -> None:
    stream = _stream(tiny_dataset)
    width = SEQ + 1
    grid = _grid(tiny_dataset)
    n = len(grid)
    all_ids: list[int] = []
    batches = []
    for rank in range(2):
        ids, windows = _collect(tiny_dataset, rank, 2, workers=2)
        batches.append(len(ids))
        for sid, window in zip(ids, windows, strict=True):
            assert np.array_equal(window.numpy(), stream[grid[sid]:grid[sid] + width])
        all_ids += ids
    assert batches[0] == batches[1]
    pad = len(all_ids) - n
    assert 0 <= pad < 2
    # Disjoint apart from the documented padding; the union is every window of the grid,
    # i.e. all tokens but each row group's last (tokens % (SEQ + 1)).
    assert len(stream) - n * width == sum(
        g.tokens % width for s in shards_of(tiny_dataset, read_manifest(tiny_dataset))
        for g in s.row_groups)
    assert len(set(all_ids)) == n == len(all_ids) - pad
    assert sorted(set(all_ids)) == list(range(n))


def test_order_does_not_depend_on_num_workers(tiny_dataset: str) -> None:
    ref, _ = _collect(tiny_dataset, 1, 2, workers=0)
    for workers in (1, 3):
        assert _collect(tiny_dataset, 1, 2, workers=workers)[0] == ref


def test_set_epoch_changes_the_order_deterministically(tiny_dataset: str) -> None:
    e0, _ = _collect(tiny_dataset, 0, 1, workers=0, epoch=0)
    e1, _ = _collect(tiny_dataset, 0, 1, workers=0, epoch=1)
    again, _ = _collect(tiny_dataset, 0, 1, workers=0, epoch=1)
    assert e1 == again and e0 != e1 and len(e0) == len(e1)
    assert set(e0) == set(e1)  # the same samples; the padding (<= 1 per lane) may differ


def test_no_shuffle_is_the_stream_in_order(tiny_dataset: str) -> None:
    ds = TokenDataset(tiny_dataset, SEQ, shuffle=False, rank=0, world_size=1)
    first = next(iter(ds))
    stream = _stream(tiny_dataset)
    assert first["input_ids"].tolist() == stream[:SEQ].tolist()


def test_reader_holds_a_bounded_number_of_row_groups(tiny_dataset: str) -> None:
    ds = TokenDataset(tiny_dataset, SEQ, rank=0, world_size=1, lookahead_groups=1,
                      window_blocks=1)
    samples = ds.rank_order()
    windows = ds.windows(samples)
    assert sum(1 for _ in windows) == len(samples)
    # Samples never span row groups: each group is read once and dropped after its block,
    # so the reader holds the current group plus the lookahead, whatever the dataset size.
    assert len(ds.source.index) >= 12
    assert windows.max_resident <= 3


def test_rank_without_world_size_is_refused(tiny_dataset: str) -> None:
    with pytest.raises(ValueError, match="rank and world_size"):
        TokenDataset(tiny_dataset, SEQ, rank=0)


def test_batch_thread_gives_the_same_batches_and_stops_cleanly(tiny_dataset: str) -> None:
    import threading
    import time

    plain = [b["input_ids"] for b in build_dataloader(tiny_dataset, 4, SEQ)]
    ahead = build_dataloader(tiny_dataset, 4, SEQ, batch_thread=True, prefetch_factor=2)
    got = []
    for i, b in enumerate(ahead):
        got.append(b["input_ids"])
        if i % 3 == 0:
            time.sleep(0.01)  # a busy caller: the thread builds ahead meanwhile
    assert len(got) == len(plain) > 3
    assert all(torch.equal(a, b) for a, b in zip(plain, got, strict=True))
    it = iter(build_dataloader(tiny_dataset, 4, SEQ, batch_thread=True))
    next(it)
    it.close()  # abandoning an epoch stops the builder thread
    deadline = time.time() + 30  # a liveness bound (ms here): a thread left running never ends
    while any(t.name == "shardflow-batches" for t in threading.enumerate()):
        assert time.time() < deadline, "batch thread still running after close()"
        time.sleep(0.05)
