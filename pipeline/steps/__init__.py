"""Steps: every transformation between reading a record and tokenizing it, built-in or a
user's, behind one small interface (:mod:`pipeline.steps.contract`), composed by a recipe
(:mod:`pipeline.steps.recipe`) and run by :class:`pipeline.steps.chain.StepChain`.

A user step needs only :class:`Doc` from here (for type hints) and to follow the contract."""

from pipeline.steps.contract import Doc, StepError

__all__ = ["Doc", "StepError"]
