"""Per-rank digests of the batches a rank trained on.

Written so that a run can be checked after the fact: that ranks saw different data, that an
epoch did not repeat a sample, and (later) that a resumed run continued the same sequence.
Costs one small hash per row per step; the batch never leaves the process.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import torch

from trainer.metrics import JsonlWriter, truncate_jsonl

#: How many leading token ids of each row to keep in clear, for eyeballing.
HEAD_TOKENS = 4


def row_digests(input_ids: torch.Tensor) -> list[str]:
    """A short, stable hash of each row's token ids (independent of dtype and device)."""
    rows = input_ids.detach().to("cpu", torch.int64).numpy()
    return [hashlib.blake2b(np.ascontiguousarray(r).tobytes(), digest_size=8).hexdigest()
            for r in rows]


def path_for(run_dir: str | os.PathLike[str], rank: int) -> str:
    return os.path.join(os.fspath(run_dir), f"rank{rank}_samples.jsonl")


class SampleLog:
    """``<run_dir>/rank<r>_samples.jsonl``: one line per step with the epoch, a digest per row,
    the first :data:`HEAD_TOKENS` ids of each row and, when the loader gives them, the sample
    ids. A resumed run appends (``mode="a"``) after dropping the records of the steps it
    repeats (:func:`trainer.metrics.truncate_jsonl`)."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int, mode: str = "w") -> None:
        self.path = path_for(run_dir, rank)
        self.writer = JsonlWriter(self.path, mode)

    def record(self, step: int, epoch: int, input_ids: torch.Tensor,
               sample_ids: torch.Tensor | None = None) -> None:
        rec = {
            "step": step,
            "epoch": epoch,
            "rows": row_digests(input_ids),
            "head": input_ids[:, :HEAD_TOKENS].tolist(),
        }
        if sample_ids is not None:
            rec["sample_ids"] = sample_ids.tolist()
        self.writer.write(rec)

    def close(self) -> None:
        self.writer.close()


def truncate_departed(run_dir: str | os.PathLike[str], world_size: int, step: int) -> None:
    """After a resume on fewer ranks: drop the records after ``step`` from the sample logs of
    ranks that no longer exist (each live rank truncates its own), so that the logs of the
    run dir still say exactly which samples each step trained on."""
    rank = world_size
    while os.path.exists(path_for(run_dir, rank)):
        truncate_jsonl(path_for(run_dir, rank), step)
        rank += 1
