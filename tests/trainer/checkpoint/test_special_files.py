"""A checkpoint folder is untrusted: a FIFO, socket or device planted in it (as a shard, as
``trainer.json``, as a rank's RNG file) is refused by name before anything is opened, never
waited on; an oversized ``trainer.json`` is refused without being read whole."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
from torch import nn

from tests._within import within
from trainer.checkpoint.checkpointer import Checkpointer, CheckpointError, load_checkpoint
from trainer.checkpoint.files import MAX_JSON_BYTES


def _saved(tmp_path: Path) -> tuple[Path, nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(3, 3)
    opt = torch.optim.AdamW(model.parameters())
    return Path(Checkpointer(str(tmp_path / "ck")).save(5, model, opt, {})), model, opt


def _replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def test_the_saved_checkpoint_loads(tmp_path: Path) -> None:
    path, model, opt = _saved(tmp_path)
    assert load_checkpoint(str(path), model, opt).step == 5


@pytest.mark.parametrize("victim", ["shard", "trainer.json", "rng"])
def test_a_fifo_planted_in_a_checkpoint_is_refused_at_once(tmp_path: Path, victim: str) -> None:
    path, model, opt = _saved(tmp_path)
    target = {"shard": next(path.glob("*.distcp")), "trainer.json": path / "trainer.json",
              "rng": next((path / "rng").glob("*.json"))}[victim]
    _replace_with_fifo(target)
    raised, _ = within(20, load_checkpoint, str(path), model, opt)  # before: blocked forever
    assert isinstance(raised, CheckpointError), raised
    assert f"{target} is a FIFO (named pipe), not a regular file" in str(raised)


def test_a_socket_in_a_checkpoint_is_refused(tmp_path: Path) -> None:
    path, model, opt = _saved(tmp_path)
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(path / "s.sock"))
        with pytest.raises(CheckpointError, match="s.sock is a socket"):
            load_checkpoint(str(path), model, opt)
    finally:
        sock.close()


def test_a_huge_trainer_json_is_refused_unread(tmp_path: Path) -> None:
    path, model, opt = _saved(tmp_path)
    with open(path / "trainer.json", "r+b") as fh:
        fh.truncate(50 << 30)  # sparse: 50 GB stated, nothing on disk
    raised, _ = within(20, load_checkpoint, str(path), model, opt)
    assert isinstance(raised, CheckpointError), raised
    assert "trainer.json" in str(raised) and f"{MAX_JSON_BYTES:,}" in str(raised)
