import numpy as np
import torch

from loaders import build_dataloader
from loaders.packing import cu_seqlens, position_ids

EOS = 9


def test_position_ids_restart_after_each_eos() -> None:
    x = np.array([[5, 6, EOS, 7, 8, EOS], [EOS, 1, 2, 3, EOS, 4]])
    assert position_ids(x, EOS).tolist() == [[0, 1, 2, 0, 1, 2], [0, 0, 1, 2, 3, 0]]


def test_cu_seqlens_cut_at_eos_and_row_ends() -> None:
    x = np.array([[5, 6, EOS, 7], [1, EOS, 2, 3]])
    assert cu_seqlens(x, EOS).tolist() == [0, 3, 4, 6, 8]


def test_loader_yields_position_ids(tiny_dataset: str) -> None:
    loader = build_dataloader(tiny_dataset, 4, 64, rank=0, world_size=1,
                              return_position_ids=True)
    batch = next(iter(loader))
    pos, ids = batch["position_ids"], batch["input_ids"]
    assert pos.shape == ids.shape and pos.dtype == torch.long
    after_eos = torch.zeros_like(ids, dtype=torch.bool)
    after_eos[:, 1:] = ids[:, :-1] == 50256
    assert (pos[after_eos] == 0).all() and (pos[:, 0] == 0).all()
    assert after_eos.any()  # Shakespeare paragraphs are short: boundaries in every batch
