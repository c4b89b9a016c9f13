"""HF transformers ``Trainer`` under torchrun, 2 CPU processes (gloo), a 1-layer GPT-2.

``torchrun --nproc-per-node 2 hf_trainer.py DATASET OUT STEPS``: the loader is built before
``TrainingArguments`` (which makes the process group) and takes its rank at its first
iteration. ``get_train_dataloader`` returns it as :class:`loaders.hf.CausalLMBatches`
(the loader's labels as ``shift_labels``), not through ``accelerator.prepare``; the
Trainer calls ``set_epoch`` each epoch. Each rank writes ``OUT/hf_rank<r>.json``: the
sample ids of every batch, and the first step's loss as the Trainer logged it next to the
loss computed by hand from the initial model's logits with the right targets (the
loader's labels) and with the targets a double shift would use.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import BATCH, SEED, SEQ, write_record  # noqa: E402

from loaders import build_dataloader  # noqa: E402
from loaders.hf import CausalLMBatches  # noqa: E402
from storage import read_manifest  # noqa: E402


class Recorded(CausalLMBatches):
    """The recipe's batches, keeping what the test checks (the loader's own batches)."""

    def __init__(self, loader) -> None:  # noqa: ANN001
        super().__init__(loader)
        self.batches: list[dict[str, torch.Tensor]] = []

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for batch in self.loader:
            self.batches.append(batch)
            yield self.for_model(batch)


class ShardflowTrainer(Trainer):
    def __init__(self, *args, train_batches: CausalLMBatches, **kwargs) -> None:  # noqa: ANN002,ANN003
        super().__init__(*args, **kwargs)
        self.train_batches = train_batches

    def get_train_dataloader(self) -> CausalLMBatches:  # type: ignore[override]
        return self.train_batches  # already this rank's share: not prepared


def ce(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                   targets.flatten()))


def main() -> None:
    dataset, out, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    loader = build_dataloader(dataset, batch_size=BATCH, seq_len=SEQ, seed=SEED,
                              return_sample_id=True)  # no process group yet
    args = TrainingArguments(output_dir=str(out / "hf"), per_device_train_batch_size=BATCH,
                             max_steps=steps, learning_rate=1e-2, logging_steps=1,
                             use_cpu=True, ddp_backend="gloo", report_to="none",
                             save_strategy="no", disable_tqdm=True, seed=0,
                             dataloader_pin_memory=False)
    assert dist.is_initialized() and dist.get_world_size() == 2
    # a large initial range: the losses against right and wrong targets lie far apart
    config = GPT2Config(vocab_size=read_manifest(dataset).vocab_size, n_positions=SEQ,
                        n_layer=1, n_head=2, n_embd=32, initializer_range=0.5,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # no dropout
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    initial = copy.deepcopy(model).eval()
    batches = Recorded(loader)
    trainer = ShardflowTrainer(model=model, args=args, train_batches=batches)
    trainer.train()

    first = batches.batches[0]
    with torch.no_grad():
        logits = initial(input_ids=first["input_ids"]).logits
    losses = {"right": ce(logits, first["labels"]),  # the next token at every position
              "double_shift": ce(logits[:, :-1], first["labels"][:, 1:])}
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    write_record(out, "hf", dist.get_rank(),
                 {"ids": [b["sample_id"].tolist() for b in batches.batches],
                  "logged": logged, "losses": losses})


if __name__ == "__main__":
    main()
