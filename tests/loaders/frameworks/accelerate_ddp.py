"""HF accelerate under torchrun, 2 CPU processes (gloo), the loader built before Accelerator().

``torchrun --nproc-per-node 2 accelerate_ddp.py DATASET OUT STEPS``: the loader takes its rank
at its first iteration, after ``Accelerator()`` made the process group. It is not wrapped by
``accelerator.prepare`` (it already reads only this rank's share; prepare hands back what is
not a torch DataLoader unchanged, which the script checks) and is registered for
checkpointing, so ``save_state``/``load_state`` carry its position: after STEPS steps (past
the first epoch, by iterating the loader again) the state saved at step 8 is loaded back and
the same loader continues from there. Each rank writes ``OUT/accelerate_rank<r>.json``:
``{"steps": [[epoch, sample ids], ...], "resumed": [...]}``.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import BATCH, SEED, SEQ, TinyLM, lm_loss, write_record  # noqa: E402

from loaders import build_dataloader  # noqa: E402
from storage import read_manifest  # noqa: E402


def train(accelerator: Accelerator, loader, model, optimizer, steps: int,  # noqa: ANN001
          save_at: int | None = None, save_to: Path | None = None) -> list[list[object]]:
    """``steps`` steps, iterating the loader again at each epoch's end (the next epoch)."""
    seen: list[list[object]] = []
    while len(seen) < steps:
        for batch in itertools.islice(loader, steps - len(seen)):
            seen.append([loader.epoch, batch["sample_id"].tolist()])
            loss = lm_loss(model(batch["input_ids"]), batch["labels"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if len(seen) == save_at and save_to is not None:
                accelerator.save_state(str(save_to))
    return seen


def main() -> None:
    dataset, out, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    loader = build_dataloader(dataset, batch_size=BATCH, seq_len=SEQ, seed=SEED,
                              return_sample_id=True)  # before Accelerator(): no group yet
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2, accelerator.state
    model = TinyLM(read_manifest(dataset).vocab_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert accelerator.prepare(loader) is loader  # left as it is: not a torch DataLoader
    accelerator.register_for_checkpointing(loader)
    state_dir = out / "accelerate-state"
    seen = train(accelerator, loader, model, optimizer, steps, save_at=8, save_to=state_dir)
    accelerator.load_state(str(state_dir))
    resumed = train(accelerator, loader, model, optimizer, steps - 8)
    write_record(out, "accelerate", accelerator.process_index,
                 {"steps": seen, "resumed": resumed})


if __name__ == "__main__":
    main()
