"""``torch.load(weights_only=True)`` of bytes from a checkpoint, after the opcode walk of
:mod:`trainer.checkpoint.pickle_guard`.

``weights_only`` limits which globals a pickle may name, not what unpickling it costs: a
checkpoint's non-tensor values (DCP's ``BYTE_IO`` entries: optimizer hyper-parameters) and a
delta's base chunks are ``torch.save`` archives whose ``data.pkl`` a file can make into a memo
tuple DAG as a dict key (``t[i+1] = (t[i], t[i])``): torch's weights-only unpickler hashes
``2**levels`` leaves (measured: 24 levels, ~300 bytes, 0.2 s; each level doubles it: 40 levels
are hours, 64 forever), on every rank at every resume. So the archive's pickle is walked first,
with the same bounds as DCP's metadata (depth, work, memory, dict keys only strings), no
``BUILD`` at all (``torch.save`` of tensors and plain values uses none) and persistent ids
admitted (a tensor's storage: torch's unpickler resolves those). The pickle walked is the one
torch loads: read through torch's own archive reader, and anything but a zip archive (torch's
legacy format unpickles several pickles) is refused.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from trainer.checkpoint.pickle_guard import PickleBombError, check_pickle
from trainer.checkpoint.safe_metadata import UnsafeCheckpointError

#: the first bytes of a zip archive (what ``torch.load`` checks to take its zip path)
_ZIP_MAGIC = b"PK\x03\x04"


def load_torch_bytes(blob: bytes, source: str, **load_kwargs: Any) -> Any:
    """``torch.load(blob, weights_only=True, **load_kwargs)`` once its pickle passes the walk;
    :class:`~trainer.checkpoint.safe_metadata.UnsafeCheckpointError` naming ``source`` otherwise."""
    if blob[:4] != _ZIP_MAGIC:
        raise UnsafeCheckpointError(f"{source}: not a torch.save zip archive; refusing to "
                                    "load it")
    try:
        pickled = torch._C.PyTorchFileReader(io.BytesIO(blob)).get_record("data.pkl")
    except Exception as exc:  # noqa: BLE001 - any unreadable archive is one clear error
        raise UnsafeCheckpointError(f"{source}: unreadable torch.save archive "
                                    f"({type(exc).__name__}: {exc})"[:500]) from None
    try:
        check_pickle(pickled, frozenset(), source, persistent_ids=True)
    except PickleBombError as exc:
        raise UnsafeCheckpointError(str(exc)) from None
    return torch.load(io.BytesIO(blob), weights_only=True, **load_kwargs)
