"""Shardflow trainer: a small GPT trained with DDP from a Shardflow dataset.

Imports ``loaders`` and ``storage`` only (never ``pipeline`` or Dask). Modules, one job each:

- ``config``      flags, device-dependent defaults, resolution into a complete config
- ``model``       the GPT (``GPTConfig``, ``GPT``), parameter and FLOP counts
- ``schedule``    learning rate: linear warmup + cosine, a pure function
- ``optim``       AdamW with decay on matrices only
- ``distributed`` process group, device and backend choice, small collectives
- ``parallelize`` DDP or FSDP2 (HSDP across nodes)
- ``checkpoint`` DCP checkpoints with the loader state, atomic, safe to load
- ``data``        the real loader and the endless epoch stream over it
- ``metrics``     interval accounting (tokens/s, data wait), JSON lines, summary
- ``samples``     per-rank digests of the batches each rank trained on
- ``train``       the loop and the run around it
- ``plot``, ``cli`` the ``plot`` subcommand and the command-line dispatch

Nothing is imported here: ``python -m trainer plot`` should not pay for torch.
"""
