"""Plain torch under torchrun, 2 CPU processes (gloo): loaders built before
``init_process_group``, iterated after it.

``torchrun --nproc-per-node 2 torch_late_group.py DATASET OUT``. Each rank writes
``OUT/torch_rank<r>.json`` with the sample ids of:

- ``loader``: two passes of a ``build_dataloader`` loader (the second is epoch 1);
- ``spawned``: a ``TokenDataset`` under a DataLoader whose worker is started by ``spawn``
  (a fresh interpreter, with no process group: it takes its parent's rank);
- ``alone`` / ``refused``: with ``WORLD_SIZE`` hidden, as under Lightning's launcher before
  it starts the other processes, a loader reads as rank 0 of 1 until the group exists. A
  loader on a fixed global batch that read one whole global batch then carries on in the
  group (the elastic rule); one whose plan changes with the world size refuses to go on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import BATCH, SEED, SEQ, write_record  # noqa: E402

from loaders import TokenDataset, build_dataloader  # noqa: E402
from loaders.world import WorldNotReadyError  # noqa: E402


def ids(loader) -> list[list[int]]:  # noqa: ANN001
    return [b["sample_id"].tolist() for b in loader]


def main() -> None:
    dataset, out = sys.argv[1], Path(sys.argv[2])
    world = os.environ.pop("WORLD_SIZE")  # hidden while the loaders below read alone
    kw = {"seed": SEED, "return_sample_id": True}
    fixed = build_dataloader(dataset, BATCH, SEQ, global_batch_size=2 * BATCH, **kw)
    moving = build_dataloader(dataset, BATCH, SEQ, **kw)  # lanes: BATCH x world size
    it = iter(fixed)
    alone = [next(it)["sample_id"].tolist() for _ in range(2)]  # one global batch, alone
    del it
    next(iter(moving))
    os.environ["WORLD_SIZE"] = world

    loader = build_dataloader(dataset, BATCH, SEQ, **kw)  # no process group yet
    dataset_ = TokenDataset(dataset, SEQ, batch_size=BATCH, **kw)
    dist.init_process_group("gloo")
    passes = [ids(loader), ids(loader)]
    spawned = ids(DataLoader(dataset_, batch_size=BATCH, num_workers=1,
                             multiprocessing_context="spawn"))
    try:
        iter(moving)
        refused = ""
    except WorldNotReadyError as exc:
        refused = str(exc)
    write_record(out, "torch", dist.get_rank(),
                 {"loader": passes, "spawned": spawned, "alone": alone,
                  "fixed_rest": ids(fixed), "refused": refused})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
