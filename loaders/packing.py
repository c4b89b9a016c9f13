"""Document boundaries inside packed windows.

Windows cross document boundaries (no tokens wasted on padding). A trainer that must not let
attention cross documents can use ``position_ids`` that restart after every EOS, or the
``cu_seqlens`` of variable-length attention kernels (flash-attn ``varlen``), both derived here
from the EOS positions alone.
"""

from __future__ import annotations

import numpy as np


def position_ids(inputs: np.ndarray, eos_id: int) -> np.ndarray:
    """Per token, its position within its document; the token after an EOS starts at 0.

    ``inputs`` is ``[batch, seq_len]``; the first token of each row starts at 0 (the row's
    earlier context is not in the window).
    """
    batch, length = inputs.shape
    idx = np.broadcast_to(np.arange(length, dtype=np.int64), (batch, length))
    starts = np.zeros((batch, length), dtype=bool)
    starts[:, 0] = True
    starts[:, 1:] = inputs[:, :-1] == eos_id
    last_start = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    return idx - last_start


def cu_seqlens(inputs: np.ndarray, eos_id: int) -> np.ndarray:
    """Cumulative document lengths over the flattened batch (int32, starts with 0).

    Each row is cut at its EOS tokens and at its end, the layout flash-attn's varlen kernels
    take for ``[batch * seq_len]`` packed inputs.
    """
    batch, length = inputs.shape
    ends = inputs == eos_id
    ends[:, -1] = True
    flat = np.flatnonzero(ends.reshape(-1)) + 1
    return np.concatenate([[0], flat]).astype(np.int32)
