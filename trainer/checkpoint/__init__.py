"""Checkpoints: sharded atomic saves and loads with DCP (:mod:`~trainer.checkpoint.checkpointer`),
the JSON files beside them (:mod:`~trainer.checkpoint.files`), delta checkpoints
(:mod:`~trainer.checkpoint.delta`, :mod:`~trainer.checkpoint.delta_dcp`), and reading what a
checkpoint directory holds without running code from it (:mod:`~trainer.checkpoint.safe_metadata`,
:mod:`~trainer.checkpoint.safe_torch_load`, :mod:`~trainer.checkpoint.pickle_guard`).

A checkpoint directory is input from outside (``--resume auto`` over a prefix others can
write), which is why half of this package is about refusing what it did not write.
"""
