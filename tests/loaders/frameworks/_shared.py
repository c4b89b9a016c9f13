"""What the framework scripts share: the loader's shape, a tiny LM, and the record of what
each rank trained on (one JSON file per rank and run)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

#: every script reads batches of 4 windows of 32 tokens per rank, 2 ranks, seed 3
SEQ, BATCH, SEED = 32, 4, 3


class TinyLM(nn.Module):
    """Embedding and a linear head: the smallest model a causal LM loss trains."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 16)
        self.head = nn.Linear(16, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loader's labels are the next tokens already (labels[i] = input_ids[i + 1]):
    cross-entropy against them as they are, no shift."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def write_record(out: Path, name: str, rank: int, record: object) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}_rank{rank}.json").write_text(json.dumps(record))
