"""The in-process loader reads its plan a piece at a time: the same batches, in the same
order, whatever the piece size, fresh and after a resume (also mid-step)."""

from __future__ import annotations

import numpy as np
import pytest

from loaders import build_dataloader
from loaders import dataloader as dl_module

SEQ = 31


def _epoch(loader, limit: int | None = None) -> list[np.ndarray]:  # noqa: ANN001
    out = []
    for batch in loader:
        out.append(batch["input_ids"].numpy().copy())
        if limit is not None and len(out) == limit:
            break
    return out


@pytest.mark.parametrize("piece", [1, 7, 64])
def test_pieces_give_the_same_batches_as_one_piece(tiny_dataset: str, piece: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs = {"batch_size": 4, "seq_len": SEQ, "global_batch_size": 8, "rank": 1,
              "world_size": 2, "seed": 3}
    monkeypatch.setattr(dl_module, "STREAM_SAMPLES", 1 << 30)
    whole = _epoch(build_dataloader(tiny_dataset, **kwargs))
    monkeypatch.setattr(dl_module, "STREAM_SAMPLES", piece)
    loader = build_dataloader(tiny_dataset, **kwargs)
    pieces = _epoch(loader)
    assert len(whole) == len(pieces) > 10
    assert all(np.array_equal(a, b) for a, b in zip(whole, pieces, strict=True))
    # a resume part-way through continues with the same batches
    first = build_dataloader(tiny_dataset, **kwargs)
    head = _epoch(first, limit=5)
    state = first.state_dict()
    again = build_dataloader(tiny_dataset, **kwargs)
    again.load_state_dict(state)
    rest = _epoch(again)
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, whole, strict=True))


def test_mid_step_resume_with_accumulation_streams_the_same(tiny_dataset: str,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Batch 2 of a global batch of 8 on one rank: four micro-batches per step."""
    kwargs = {"batch_size": 2, "seq_len": SEQ, "global_batch_size": 8, "seed": 1}
    monkeypatch.setattr(dl_module, "STREAM_SAMPLES", 1 << 30)
    whole = _epoch(build_dataloader(tiny_dataset, **kwargs))
    monkeypatch.setattr(dl_module, "STREAM_SAMPLES", 3)
    first = build_dataloader(tiny_dataset, **kwargs)
    head = _epoch(first, limit=6)  # one and a half steps
    again = build_dataloader(tiny_dataset, **kwargs)
    again.load_state_dict(first.state_dict())
    rest = _epoch(again)
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, whole, strict=True))


def test_progress_read_after_every_batch_or_only_at_the_end_is_the_same(
        tiny_dataset: str) -> None:
    """Handed-out batches are folded into the loader's progress when it is read: reading it
    after every batch (each fold one batch) or once after many gives the same states."""
    kwargs = {"batch_size": 2, "seq_len": SEQ, "global_batch_size": 8, "seed": 4}
    eager, lazy = build_dataloader(tiny_dataset, **kwargs), build_dataloader(tiny_dataset,
                                                                              **kwargs)
    total = len(eager)
    states = []
    for i, _ in enumerate(eager):
        assert eager.remaining() == total - i - 1
        states.append(eager.state_dict())
    assert total > 6
    for i, _ in enumerate(lazy):
        if i in (2, total - 1):  # a mid-step state, then the epoch's end
            assert lazy.state_dict() == states[i]
    lazy.set_epoch(lazy.epoch + 1)
    assert lazy.remaining() == total and lazy.state_dict() != states[-1]
