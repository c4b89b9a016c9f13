"""PyTorch Lightning, DDP on 2 CPU processes (gloo), loaders built at the top level.

``python lightning_ddp.py DATASET OUT MAX_STEPS``: Lightning's own launcher starts the second
process (it runs this script again). Three loaders are built before the first
``Trainer.fit`` makes the process group; each takes its rank at its first iteration. Run
``full`` trains MAX_STEPS steps (past the first epoch) and checkpoints every 8 steps and at
the epoch's end; Lightning saves the loader's state in each checkpoint and restores it on
``ckpt_path`` (no hook needed). Runs ``step=8`` and ``epoch=0-end`` resume from those
checkpoints with a fresh model and loader. Each rank writes ``OUT/<run>_rank<r>.json``:
``[global step, epoch, sample ids]`` per batch trained on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import BATCH, SEED, SEQ, TinyLM, lm_loss, write_record  # noqa: E402

from loaders import build_dataloader  # noqa: E402
from storage import read_manifest  # noqa: E402


class LitLM(L.LightningModule):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.model = TinyLM(vocab_size)
        self.seen: list[list[object]] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.append([self.global_step, self.current_epoch, batch["sample_id"].tolist()])
        return lm_loss(self.model(batch["input_ids"]), batch["labels"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def checkpoints(where: Path) -> list[ModelCheckpoint]:
    return [ModelCheckpoint(dirpath=where, filename="{step}", every_n_train_steps=8,
                            save_top_k=-1),
            ModelCheckpoint(dirpath=where, filename="{epoch}-end", every_n_epochs=1,
                            save_top_k=-1, save_on_train_epoch_end=True)]


def main() -> None:
    dataset, out, max_steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    runs = {"full": None, "step=8": "step=8.ckpt", "epoch=0-end": "epoch=0-end.ckpt"}
    # Top level: no process group yet (Trainer.fit makes it).
    loaders = {run: build_dataloader(dataset, batch_size=BATCH, seq_len=SEQ, seed=SEED,
                                     return_sample_id=True) for run in runs}
    vocab_size = read_manifest(dataset).vocab_size
    for run, ckpt in runs.items():
        model = LitLM(vocab_size)
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=max_steps,
                            callbacks=checkpoints(out / f"ckpt-{run}"), logger=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0)
        trainer.fit(model, train_dataloaders=loaders[run],
                    ckpt_path=out / "ckpt-full" / ckpt if ckpt else None)
        write_record(out, run, trainer.global_rank, model.seen)


if __name__ == "__main__":
    main()
