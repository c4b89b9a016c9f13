"""Validating a checkpoint's JSON files (``trainer.json``, ``rng/rank<r>.json``) field by field.

A checkpoint directory is input from outside (``--resume auto`` over a prefix others can
write): a file that is not what :class:`~trainer.checkpoint.checkpointer.Checkpointer` wrote must
fail the
resume with one line naming the file and the field — not a ``KeyError`` traceback from deep
in the loop, and never be taken at face value (``"step": 10**30`` made a run print "done: 0
steps, final loss nan" and exit 0). Each check here raises :class:`CheckpointFileError` and
runs before any tensor is loaded or any state is changed.

The loader's own state (``stream.loader``) is checked by ``loaders.state.check_state`` when
the loader loads it, against the loader's plan; here only its shape (a JSON object).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

import torch

#: Largest JSON file of a checkpoint read (ours are a few KB; the RNG files ~25 KB).
MAX_JSON_BYTES = 16 << 20
#: Largest step, epoch or count admitted: 2**53 (exact in a float; a run at 10 steps/s
#: would take ~28 million years to reach it).
MAX_COUNT = 1 << 53
#: MT19937 state sizes (numpy's key, Python's internal state with its position last).
_MT_WORDS = 624
#: Bytes of a CUDA generator state (philox seed and offset).
_CUDA_STATE_BYTES = 16


class CheckpointFileError(ValueError):
    """A checkpoint JSON file that is unreadable or holds a field out of type or range."""


def read_json(data: bytes, source: str) -> dict[str, Any]:
    """The JSON object in ``data`` (at most :data:`MAX_JSON_BYTES`)."""
    if len(data) > MAX_JSON_BYTES:
        raise CheckpointFileError(f"{source}: more than {MAX_JSON_BYTES:,} bytes")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, 5000-digit ints
        raise CheckpointFileError(f"{source}: not JSON ({type(exc).__name__}: {exc})"[:300]
                                  ) from None
    if not isinstance(obj, dict):
        raise CheckpointFileError(f"{source}: holds a {type(obj).__name__}, not a JSON object")
    return obj


def _field(obj: dict[str, Any], key: str, source: str, path: str = "") -> Any:
    if key not in obj:
        raise CheckpointFileError(f"{source}: field {path + key!r} is missing")
    return obj[key]


def _int(value: Any, name: str, source: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise CheckpointFileError(f"{source}: field {name!r} is {_show(value)}, not an "
                                  f"integer in [{lo}, {hi}]")
    return value


def _float(value: Any, name: str, source: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) \
            or not math.isfinite(value):
        raise CheckpointFileError(f"{source}: field {name!r} is {_show(value)}, not a finite "
                                  "number")
    return float(value)


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, int | float | str | bool | None) \
        else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def check_trainer_state(state: dict[str, Any], source: str, *, format_version: int,
                        dir_step: int | None = None, max_step: int | None = None) -> int:
    """Validate ``trainer.json``; returns its step. ``dir_step``: the step its directory name
    says (``step-XXXXXXXX``); ``max_step``: this run's ``--steps`` (a checkpoint past the end
    of the run is refused: resuming it would train 0 steps and report success)."""
    fmt = _field(state, "format", source)
    if fmt != format_version:
        raise CheckpointFileError(f"{source}: checkpoint format {_show(fmt)}, expected "
                                  f"{format_version}")
    step = _int(_field(state, "step", source), "step", source)
    if dir_step is not None and step != dir_step:
        raise CheckpointFileError(f"{source}: field 'step' is {step} but the directory is "
                                  f"step {dir_step}")
    if max_step is not None and step > max_step:
        raise CheckpointFileError(f"{source}: field 'step' is {step}, past this run's "
                                  f"--steps {max_step}; resume with --steps >= {step}")
    for key in ("world_size", "global_batch_size", "batch_size", "seq_len"):
        if key in state and state[key] is not None:
            _int(state[key], key, source, lo=1)
    if "seed" in state:
        _int(state["seed"], "seed", source, lo=-(1 << 63), hi=(1 << 64) - 1)
    if "stream" in state:
        stream = state["stream"]
        if not isinstance(stream, dict):
            raise CheckpointFileError(f"{source}: field 'stream' is {_show(stream)}, not an "
                                      "object")
        _int(_field(stream, "epoch", source, "stream."), "stream.epoch", source)
        _int(_field(stream, "batches_in_epoch", source, "stream."), "stream.batches_in_epoch",
             source)
        if "loader" in stream and not isinstance(stream["loader"], dict):
            raise CheckpointFileError(f"{source}: field 'stream.loader' is "
                                      f"{_show(stream['loader'])}, not an object")
    if "scheduler" in state:
        _check_scheduler(state["scheduler"], step, source)
    return step


def _check_scheduler(sched: Any, step: int, source: str) -> None:
    """``LambdaLR.state_dict()`` less the lambdas: it steps once per optimizer step."""
    if not isinstance(sched, dict):
        raise CheckpointFileError(f"{source}: field 'scheduler' is {_show(sched)}, not an "
                                  "object")
    last = _int(_field(sched, "last_epoch", source, "scheduler."), "scheduler.last_epoch",
                source)
    if last != step:
        raise CheckpointFileError(f"{source}: field 'scheduler.last_epoch' is {last}, not the "
                                  f"step {step}")
    if "_step_count" in sched:
        _int(sched["_step_count"], "scheduler._step_count", source)
    for key in ("base_lrs", "_last_lr"):
        values = sched.get(key, [])
        if not isinstance(values, list) or len(values) > 1024:
            raise CheckpointFileError(f"{source}: field 'scheduler.{key}' is not a list")
        for v in values:
            _float(v, f"scheduler.{key}", source)


def _rng_bytes(value: Any, name: str, source: str, size: int | None) -> bytes:
    if not isinstance(value, str):
        raise CheckpointFileError(f"{source}: field {name!r} is {_show(value)}, not base64")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CheckpointFileError(f"{source}: field {name!r} is not base64") from None
    if size is not None and len(raw) != size:
        raise CheckpointFileError(f"{source}: field {name!r} holds {len(raw)} bytes, a "
                                  f"generator state is {size}")
    return raw


def check_rng_state(state: dict[str, Any], source: str) -> None:
    """Validate an ``rng/rank<r>.json`` (what ``checkpoint.rng_state()`` writes): the torch CPU
    state of this build's size, CUDA states of 16 bytes, numpy's and Python's MT19937 states
    with their lengths, word ranges and positions."""
    _rng_bytes(_field(state, "torch", source), "torch", source, torch.get_rng_state().numel())
    cuda = _field(state, "cuda", source)
    if not isinstance(cuda, list) or len(cuda) > 4096:
        raise CheckpointFileError(f"{source}: field 'cuda' is {_show(cuda)}, not a list")
    for i, s in enumerate(cuda):
        _rng_bytes(s, f"cuda[{i}]", source, _CUDA_STATE_BYTES)
    np_state = _field(state, "numpy", source)
    if not isinstance(np_state, dict):
        raise CheckpointFileError(f"{source}: field 'numpy' is {_show(np_state)}, not an "
                                  "object")
    if np_state.get("bit_generator") != "MT19937":
        raise CheckpointFileError(f"{source}: field 'numpy.bit_generator' is "
                                  f"{_show(np_state.get('bit_generator'))}, not \"MT19937\"")
    _words(_field(np_state, "key", source, "numpy."), _MT_WORDS, "numpy.key", source)
    _int(_field(np_state, "pos", source, "numpy."), "numpy.pos", source, hi=_MT_WORDS)
    _int(_field(np_state, "has_gauss", source, "numpy."), "numpy.has_gauss", source, hi=1)
    _float(_field(np_state, "gauss", source, "numpy."), "numpy.gauss", source)
    py = _field(state, "python", source)
    if not isinstance(py, list) or len(py) != 3:
        raise CheckpointFileError(f"{source}: field 'python' is {_show(py)}, not [version, "
                                  "state, gauss]")
    _int(py[0], "python[0]", source, lo=3, hi=3)
    _words(py[1], _MT_WORDS + 1, "python[1]", source)
    _int(py[1][-1], "python[1][-1]", source, hi=_MT_WORDS)
    if py[2] is not None:
        _float(py[2], "python[2]", source)


def _words(value: Any, n: int, name: str, source: str) -> None:
    if not isinstance(value, list) or len(value) != n:
        length = len(value) if isinstance(value, list) else _show(value)
        raise CheckpointFileError(f"{source}: field {name!r} holds {length}, not {n} words")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 32:
            raise CheckpointFileError(f"{source}: field {name!r} holds {_show(v)}, not a "
                                      "32-bit word")
