"""Batches for Hugging Face causal LMs, which shift ``labels`` themselves.

The loader's ``labels`` are the next tokens already (``labels[:, i] == input_ids[:, i + 1]``,
the window's last token included). A transformers causal LM given ``labels=`` shifts them
again (position ``i`` is scored against ``labels[:, i + 1]``): handed the loader's labels, it
would train every position on the token two ahead. :class:`CausalLMBatches` hands it the
loader's labels as ``shift_labels``, which transformers (4.50 and later) takes as the
targets as they are, every position's, the last one included, and by which the ``Trainer``
counts the tokens it averages the loss over; ``labels`` is ``input_ids``, so the model
computes a loss at all (a model that ignores ``shift_labels`` shifts these: the right
targets still, without the last position's). It iterates, has ``len`` and ``set_epoch``
like the loader, so a ``transformers.Trainer`` whose ``get_train_dataloader`` returns it
drives the loader's epochs. Nothing here imports transformers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import torch


class EpochBatches(Protocol):
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...


#: keys a causal LM's ``forward`` takes from a batch (``sample_id`` is the loader's alone)
MODEL_KEYS = ("input_ids", "position_ids")


class CausalLMBatches(Iterable[dict[str, torch.Tensor]]):
    """The batches of ``loader`` as ``{"input_ids", "labels": input_ids, "shift_labels":
    the loader's labels}`` (plus ``position_ids`` when the loader gives them)."""

    def __init__(self, loader: EpochBatches) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for batch in self.loader:
            yield self.for_model(batch)

    @staticmethod
    def for_model(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {k: batch[k] for k in MODEL_KEYS if k in batch}
        out["labels"] = batch["input_ids"]
        out["shift_labels"] = batch["labels"]
        return out
