"""Delta checkpoints, the pure part: the record codec and the retention rules.

A *delta* checkpoint stores each tensor chunk as a record encoded against the same chunk of
the last *full* checkpoint (its *base*); :mod:`trainer.checkpoint.delta_dcp` plugs the records into
DCP.
This module reads no file and knows nothing of DCP, so it is tested directly (property
tests in ``tests/trainer/checkpoint/test_delta.py``).

A record is a 24-byte header and a payload::

    magic b"SFD1" | kind u8 | itemsize u8 | 2 reserved bytes | raw length u64 | payload length u64

``kind``:

* ``SAME``  – the chunk's bytes equal the base's: no payload (frozen parameters, and any
  state that did not move, are written once, in the full checkpoint);
* ``SUB``   – zstd of the byte planes of the element-wise integer difference ``new - base``
  (each element's bit pattern read as a little-endian unsigned integer of its size, modulo
  2**bits), zigzag-mapped (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...) so that a small step either way
  has zero high bytes; splitting the elements into planes (all low bytes, then all second
  bytes, ...) puts those zeros together. What the encoder writes for a changed chunk: 3 %
  smaller than ``XOR`` on AdamW's state (docs/trainer.md, "Delta checkpoints");
* ``XOR``   – zstd of the byte planes of ``new XOR base`` (the first codec; still read);
* ``RAW``   – zstd of the byte planes of the chunk itself (no base chunk of that shape);
* ``BYTES`` – a non-tensor value (DCP's ``BYTE_IO`` item), stored as is;
* ``SAME_VALUE`` – a non-tensor value whose bytes equal the base's (the optimizer's
  hyper-parameters, mostly): no payload;
* ``BF16``  – LOSSY, only when asked for (``moments="bf16"``, for AdamW's moments): the
  float32 chunk rounded to bfloat16 (round to nearest even), stored as ``SUB`` of those 16-bit
  patterns against the base chunk rounded the same way; it decodes to the bfloat16 values
  (relative error <= 2**-8), not to the chunk.

Every kind but ``BF16`` is lossless: ``decode(encode(new, base), base) == new`` byte for
byte. A record
is untrusted input: :func:`decode` checks the header against what the metadata says the chunk
is (its length), bounds decompression by that length, and raises :class:`DeltaError` naming
the source for anything else.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

MAGIC = b"SFD1"
HEADER = struct.Struct("<4sBBHQQ")
SAME, XOR, RAW, BYTES, SUB, SAME_VALUE, BF16 = 0, 1, 2, 3, 4, 5, 6
KIND_NAMES = {SAME: "same", XOR: "xor", RAW: "raw", BYTES: "bytes", SUB: "sub",
              SAME_VALUE: "same-value", BF16: "bf16"}
#: Kinds that need the base's chunk (or value) to decode.
BASED = (SAME, XOR, SUB, BF16)
#: zstd level: 3 (zstd's default) is ~10x faster to write than 9 for ~3 % more bytes here.
LEVEL = 3
#: The largest decoded chunk a record may claim (a bound on what one record can make a
#: reader allocate, whatever its metadata says): 16 GiB.
MAX_CHUNK_BYTES = 16 << 30


class DeltaError(ValueError):
    """A delta record or manifest that is damaged, hostile or does not fit its base."""


def _zstd():  # imported lazily: only checkpoint writes and delta reads need it
    import zstandard

    return zstandard


def split_planes(data: bytes | memoryview | np.ndarray, itemsize: int) -> bytes:
    """Byte-plane split: element bytes ``b0 b1 b2 b3 | b0 b1 ...`` -> ``b0 b0 ... b1 b1 ...``."""
    a = np.frombuffer(data, dtype=np.uint8)
    if itemsize <= 1 or a.size % itemsize:
        return a.tobytes()
    return np.ascontiguousarray(a.reshape(-1, itemsize).T).tobytes()


def join_planes(data: bytes, itemsize: int) -> np.ndarray:
    """The inverse of :func:`split_planes` (uint8 array)."""
    a = np.frombuffer(data, dtype=np.uint8)
    if itemsize <= 1 or a.size % itemsize:
        return a.copy()
    return np.ascontiguousarray(a.reshape(itemsize, -1).T).reshape(-1)


def _uint(itemsize: int) -> np.dtype | None:
    return np.dtype(f"<u{itemsize}") if itemsize in (1, 2, 4, 8) else None


def sub_zigzag(new: np.ndarray, base: np.ndarray, itemsize: int) -> np.ndarray:
    """Zigzag of the element-wise ``new - base`` (uint8 arrays of whole elements) as uint8."""
    u = _uint(itemsize)
    assert u is not None
    d = new.view(u) - base.view(u)  # modulo 2**bits
    bits = 8 * itemsize
    # zigzag: the difference as a signed integer s -> 2s (s >= 0) or -2s - 1 (s < 0)
    z = (d << u.type(1)) ^ (0 - (d >> u.type(bits - 1)))
    return z.view(np.uint8)


def sub_unzigzag(z: np.ndarray, base: np.ndarray, itemsize: int) -> np.ndarray:
    """The inverse of :func:`sub_zigzag`: ``new`` from the zigzag and ``base`` (uint8)."""
    u = _uint(itemsize)
    assert u is not None
    z = z.view(u)
    d = (z >> u.type(1)) ^ (0 - (z & u.type(1)))
    return (base.view(u) + d).view(np.uint8)


def round_bf16(f32: np.ndarray) -> np.ndarray:
    """float32 bit patterns (uint8 array) -> bfloat16 bit patterns (uint16), rounded to
    nearest even, as torch's ``.to(torch.bfloat16)`` does (NaN stays NaN)."""
    u = f32.view("<u4")
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    r = np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), r)
    return r.astype("<u2")


def _header(kind: int, itemsize: int, raw_len: int, payload_len: int) -> bytes:
    return HEADER.pack(MAGIC, kind, itemsize, 0, raw_len, payload_len)


def encode_tensor(new: bytes | memoryview | np.ndarray, base: bytes | np.ndarray | None,
                  itemsize: int, level: int = LEVEL, *, bf16: bool = False) -> bytes:
    """One record for a tensor chunk's raw bytes ``new``, against ``base`` (its bytes in the
    base checkpoint, or None when the base has no chunk of that shape). ``bf16``: a changed
    float32 chunk is stored rounded to bfloat16 (LOSSY: a ``BF16`` record); an unchanged one
    or one without a base is stored exactly all the same."""
    a = np.frombuffer(new, dtype=np.uint8)
    if itemsize < 1 or itemsize > 255:
        raise ValueError(f"itemsize {itemsize} out of range")
    if base is not None:
        b = np.frombuffer(base, dtype=np.uint8)
        if b.size != a.size:
            raise ValueError(f"base chunk of {b.size} bytes, new of {a.size}")
        if np.array_equal(a, b):
            return _header(SAME, itemsize, a.size, 0)
        zc = _zstd().ZstdCompressor(level=level)
        if bf16 and itemsize == 4 and a.size % 4 == 0:
            z = sub_zigzag(round_bf16(a).view(np.uint8), round_bf16(b).view(np.uint8), 2)
            payload = zc.compress(split_planes(z, 2))
            return _header(BF16, itemsize, a.size, len(payload)) + payload
        if _uint(itemsize) is not None and a.size % itemsize == 0:
            payload = zc.compress(split_planes(sub_zigzag(a, b, itemsize), itemsize))
            return _header(SUB, itemsize, a.size, len(payload)) + payload
        payload = zc.compress(split_planes(np.bitwise_xor(a, b), itemsize))
        return _header(XOR, itemsize, a.size, len(payload)) + payload
    payload = _zstd().ZstdCompressor(level=level).compress(split_planes(a, itemsize))
    return _header(RAW, itemsize, a.size, len(payload)) + payload


def encode_bytes(value: bytes | memoryview, base: bytes | None = None) -> bytes:
    """A record for a non-tensor value (already serialised by DCP); ``base``: the same
    value's bytes in the base checkpoint, if any (equal: a ``SAME_VALUE`` record)."""
    value = bytes(value)
    if base is not None and value == base:
        return _header(SAME_VALUE, 1, len(value), 0)
    return _header(BYTES, 1, len(value), len(value)) + value


@dataclass(frozen=True)
class Record:
    kind: int
    itemsize: int
    raw_len: int
    payload: bytes


def parse(record: bytes, source: str) -> Record:
    """The header of one record, checked for shape (not yet against the metadata)."""
    if len(record) < HEADER.size:
        raise DeltaError(f"{source}: a delta record of {len(record)} bytes, shorter than its "
                         f"{HEADER.size}-byte header (a torn or truncated file?)")
    magic, kind, itemsize, _, raw_len, payload_len = HEADER.unpack_from(record)
    if magic != MAGIC:
        raise DeltaError(f"{source}: not a delta record (magic {magic!r})")
    if kind not in KIND_NAMES:
        raise DeltaError(f"{source}: unknown record kind {kind}")
    if payload_len != len(record) - HEADER.size:
        raise DeltaError(f"{source}: the record says {payload_len} payload bytes, it holds "
                         f"{len(record) - HEADER.size} (a torn or truncated file?)")
    if raw_len > MAX_CHUNK_BYTES:
        raise DeltaError(f"{source}: a record of {raw_len:,} decoded bytes, over the cap of "
                         f"{MAX_CHUNK_BYTES:,} (MAX_CHUNK_BYTES)")
    if kind in (SAME, SAME_VALUE) and payload_len:
        raise DeltaError(f"{source}: a '{KIND_NAMES[kind]}' record with a payload")
    if kind == BYTES and payload_len != raw_len:
        raise DeltaError(f"{source}: a 'bytes' record whose lengths differ")
    return Record(kind, itemsize, raw_len, bytes(record[HEADER.size:]))


def _decompress(payload: bytes, raw_len: int, source: str) -> bytes:
    zstd = _zstd()
    try:
        out = zstd.ZstdDecompressor().decompress(payload, max_output_size=raw_len)
    except zstd.ZstdError as exc:
        raise DeltaError(f"{source}: corrupt compressed payload ({exc})"[:300]) from None
    if len(out) != raw_len:
        raise DeltaError(f"{source}: decompressed to {len(out)} bytes, expected {raw_len}")
    return out


def decode_tensor(record: bytes, base: bytes | np.ndarray | None, expected_len: int,
                  itemsize: int, source: str) -> np.ndarray:
    """The chunk's raw bytes (a uint8 array of ``expected_len``). ``base``: the same chunk in
    the base checkpoint (needed by ``same`` and ``xor`` records); ``expected_len`` and
    ``itemsize`` come from the checkpoint's metadata, and the record must agree."""
    r = parse(record, source)
    if r.kind in (BYTES, SAME_VALUE):
        raise DeltaError(f"{source}: a '{KIND_NAMES[r.kind]}' record where a tensor was "
                         "expected")
    if r.raw_len != expected_len or r.itemsize != itemsize:
        raise DeltaError(f"{source}: the record is of {r.raw_len} bytes of {r.itemsize}-byte "
                         f"elements, the metadata says {expected_len} of {itemsize}")
    if r.kind in BASED:
        if base is None:
            raise DeltaError(f"{source}: a '{KIND_NAMES[r.kind]}' record but the base "
                             "checkpoint has no chunk of that shape")
        b = np.frombuffer(base, dtype=np.uint8)
        if b.size != expected_len:
            raise DeltaError(f"{source}: the base chunk is {b.size} bytes, not {expected_len}")
        if r.kind == SAME:
            return b.copy()
        if r.kind == BF16:
            if itemsize != 4 or expected_len % 4:
                raise DeltaError(f"{source}: a 'bf16' record for {itemsize}-byte elements "
                                 "(only float32 chunks are stored so)")
            z = join_planes(_decompress(r.payload, r.raw_len // 2, source), 2)
            q = sub_unzigzag(z, round_bf16(b).view(np.uint8), 2).view("<u2")
            return (q.astype("<u4") << np.uint32(16)).view(np.uint8)
        if r.kind == SUB:
            if _uint(itemsize) is None or expected_len % itemsize:
                raise DeltaError(f"{source}: a 'sub' record for {itemsize}-byte elements")
            z = join_planes(_decompress(r.payload, r.raw_len, source), itemsize)
            return sub_unzigzag(z, b, itemsize)
        x = join_planes(_decompress(r.payload, r.raw_len, source), itemsize)
        return np.bitwise_xor(x, b)
    return join_planes(_decompress(r.payload, r.raw_len, source), itemsize)


def decode_bytes(record: bytes, source: str, cap: int, base: bytes | None = None) -> bytes:
    """A non-tensor value; ``base``: its bytes in the base checkpoint (needed by a
    ``same-value`` record)."""
    r = parse(record, source)
    if r.kind not in (BYTES, SAME_VALUE):
        raise DeltaError(f"{source}: a '{KIND_NAMES[r.kind]}' record where a value was "
                         "expected")
    if r.raw_len > cap:
        raise DeltaError(f"{source}: a value of {r.raw_len:,} bytes, over the cap of {cap:,}")
    if r.kind == SAME_VALUE:
        if base is None or len(base) != r.raw_len:
            raise DeltaError(f"{source}: a 'same-value' record but the base checkpoint has "
                             f"no value of {r.raw_len} bytes there")
        return bytes(base)
    return r.payload


# -- which saves are full, which checkpoints are kept ----------------------------------------


@dataclass(frozen=True)
class Entry:
    """A checkpoint directory as the retention rules see it. ``base``: the step of the full
    checkpoint a delta needs (None for a full one); ``index``: which delta of that base it is
    (1, 2, ...), recorded at save time because pruning may have removed the earlier ones."""

    step: int
    complete: bool
    base: int | None = None
    index: int = 0

    @property
    def is_delta(self) -> bool:
        return self.base is not None


def next_base(entries: Sequence[Entry], full_every: int) -> tuple[int, int] | None:
    """``(base step, delta index)`` of the next save, or None when it must be full.

    Every ``full_every``-th save is full: after a full checkpoint F come deltas 1 ..
    ``full_every - 1`` against F. Decided from the newest complete checkpoint alone
    (incomplete ones are saves that crashed: as if they never happened); a delta whose base
    is gone is followed by a full save. ``full_every == 1``: every save is full.
    """
    if full_every < 1:
        raise ValueError(f"full_every must be >= 1, got {full_every}")
    done = {e.step: e for e in entries if e.complete}
    if not done or full_every == 1:
        return None
    newest = done[max(done)]
    if newest.base is None:
        return newest.step, 1
    base = done.get(newest.base)
    if base is None or base.is_delta or newest.index + 1 > full_every - 1:
        return None
    return newest.base, newest.index + 1


def to_remove(entries: Iterable[Entry], keep: int) -> list[int]:
    """Steps to delete: everything but the newest ``keep`` complete checkpoints, the full
    checkpoints a kept delta needs, and incomplete ones newer than the newest complete one
    (a save that may still be running). Old deltas go only when no kept checkpoint needs
    them; a base goes only when no kept delta names it."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    entries = sorted(entries, key=lambda e: e.step)
    complete = [e for e in entries if e.complete]
    if not complete:
        return []
    kept = {e.step for e in complete[-keep:]}
    kept |= {e.base for e in complete if e.step in kept and e.base is not None}
    newest = complete[-1].step
    return [e.step for e in entries
            if e.step not in kept and (e.complete or e.step < newest)]
