"""The delta codec and the retention rules (trainer/checkpoint/delta.py): pure, property-tested."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.checkpoint.delta import (
    BF16,
    HEADER,
    RAW,
    SAME,
    SAME_VALUE,
    SUB,
    XOR,
    DeltaError,
    Entry,
    decode_bytes,
    decode_tensor,
    encode_bytes,
    encode_tensor,
    join_planes,
    next_base,
    parse,
    round_bf16,
    split_planes,
    to_remove,
)

ITEMSIZES = st.sampled_from([1, 2, 4, 8])


@st.composite
def chunks(draw: st.DrawFn) -> tuple[bytes, bytes | None, int]:
    itemsize = draw(ITEMSIZES)
    n = draw(st.integers(0, 64)) * itemsize
    new = draw(st.binary(min_size=n, max_size=n))
    base = draw(st.one_of(st.none(), st.binary(min_size=n, max_size=n),
                          st.just(new),  # unchanged (a frozen parameter)
                          # a few flipped bytes (a small update)
                          st.lists(st.integers(0, max(n - 1, 0)), max_size=4).map(
                              lambda idx: bytes(b ^ (0x5A if i in idx else 0)
                                                for i, b in enumerate(new)))))
    return new, base, itemsize


@settings(max_examples=200, deadline=None)
@given(chunks())
def test_records_round_trip_bit_for_bit(case: tuple[bytes, bytes | None, int]) -> None:
    new, base, itemsize = case
    record = encode_tensor(new, base, itemsize)
    out = decode_tensor(record, base, len(new), itemsize, "test")
    assert out.tobytes() == new
    kind = parse(record, "test").kind
    if base is None:
        assert kind == RAW
    elif base == new:
        assert kind == SAME and len(record) == HEADER.size  # written once: no payload
    else:
        assert kind == SUB


@given(chunks())
def test_xor_records_of_the_first_codec_still_decode(case: tuple[bytes, bytes | None, int]
                                                     ) -> None:
    import zstandard

    new, base, itemsize = case
    if base is None:
        return
    x = np.bitwise_xor(np.frombuffer(new, np.uint8), np.frombuffer(base, np.uint8))
    payload = zstandard.ZstdCompressor().compress(split_planes(x, itemsize))
    record = HEADER.pack(b"SFD1", XOR, itemsize, 0, len(new), len(payload)) + payload
    assert decode_tensor(record, base, len(new), itemsize, "old").tobytes() == new


FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(FLOATS, FLOATS), max_size=64))
def test_bf16_records_decode_to_the_rounded_chunk_and_only_when_asked(
        pairs: list[tuple[float, float]]) -> None:
    import torch

    new = np.array([a for a, _ in pairs], dtype=np.float32)
    base = np.array([b for _, b in pairs], dtype=np.float32)
    record = encode_tensor(new.tobytes(), base.tobytes(), 4, bf16=True)
    out = decode_tensor(record, base.tobytes(), new.nbytes, 4, "m").view(np.float32)
    if np.array_equal(new.view(np.uint32), base.view(np.uint32)):
        assert parse(record, "m").kind == SAME
        assert out.tobytes() == new.tobytes()
    else:
        assert parse(record, "m").kind == BF16
        want = torch.from_numpy(new.copy()).to(torch.bfloat16).float().numpy()
        assert out.tobytes() == want.tobytes()  # torch's rounding, bit for bit
        assert round_bf16(new.view(np.uint8)).tobytes() == \
            torch.from_numpy(new.copy()).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    # never without the flag, and never for other element sizes
    assert parse(encode_tensor(new.tobytes(), base.tobytes(), 4), "m").kind in (SAME, SUB)
    assert parse(encode_tensor(new.tobytes(), base.tobytes(), 2, bf16=True), "m").kind \
        in (SAME, SUB)


@given(st.binary(max_size=200), ITEMSIZES)
def test_planes_invert(data: bytes, itemsize: int) -> None:
    assert join_planes(split_planes(data, itemsize), itemsize).tobytes() == data


@given(st.binary(max_size=100), st.one_of(st.none(), st.binary(max_size=100)))
def test_value_records_round_trip(value: bytes, base: bytes | None) -> None:
    record = encode_bytes(value, base)
    assert decode_bytes(record, "v", cap=1000, base=base) == value
    if value == base:  # unchanged since the base (hyper-parameters): written once
        assert parse(record, "v").kind == SAME_VALUE and len(record) == HEADER.size
        with pytest.raises(DeltaError, match="same-value"):
            decode_bytes(record, "v", cap=1000, base=None)


def test_small_updates_compress_far_below_the_raw_chunk() -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal(50_000).astype(np.float32)
    new = base + np.float32(1e-4) * rng.standard_normal(50_000).astype(np.float32)
    raw = encode_tensor(new.tobytes(), None, 4)
    delta = encode_tensor(new.tobytes(), base.tobytes(), 4)
    assert len(delta) < 0.75 * len(raw), (len(delta), len(raw))


# -- untrusted records ----------------------------------------------------------------------

def _good() -> tuple[bytes, bytes]:
    base = np.arange(256, dtype=np.float32).tobytes()
    new = (np.arange(256, dtype=np.float32) + 0.5).tobytes()
    return encode_tensor(new, base, 4), base


@pytest.mark.parametrize("damage, message", [
    (lambda r: r[: HEADER.size - 1], "shorter than its"),
    (lambda r: r[:-3], "torn or truncated"),
    (lambda r: b"XXXX" + r[4:], "not a delta record"),
    (lambda r: r[:4] + bytes([9]) + r[5:], "unknown record kind"),
    (lambda r: r[:HEADER.size] + bytes(len(r) - HEADER.size), "corrupt compressed payload"),
])
def test_damaged_records_are_clear_errors(damage, message: str) -> None:
    record, base = _good()
    with pytest.raises(DeltaError, match=message) as info:
        decode_tensor(damage(record), base, len(base), 4, "ck/__0_0.sfdelta ('w')")
    assert "ck/__0_0.sfdelta" in str(info.value)


def test_a_record_cannot_claim_more_than_its_metadata_or_need_a_missing_base() -> None:
    record, base = _good()
    with pytest.raises(DeltaError, match="the metadata says"):
        decode_tensor(record, base, len(base) * 2, 4, "src")
    with pytest.raises(DeltaError, match="base checkpoint has no chunk"):
        decode_tensor(record, None, len(base), 4, "src")
    # a compression bomb: 1 GiB of zeros claimed as a 1 KiB chunk
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(bytes(1 << 20))
    forged = HEADER.pack(b"SFD1", RAW, 4, 0, 1024, len(bomb)) + bomb
    with pytest.raises(DeltaError):
        decode_tensor(forged, None, 1024, 4, "src")
    with pytest.raises(DeltaError, match="over the cap"):
        decode_bytes(encode_bytes(b"x" * 100), "src", cap=10)


# -- retention ------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(full_every=st.integers(1, 5), keep=st.integers(1, 4),
       crashes=st.lists(st.booleans(), min_size=1, max_size=30))
def test_saves_and_pruning_keep_every_needed_base(full_every: int, keep: int,
                                                  crashes: list[bool]) -> None:
    """Simulate a run: each save is full or a delta per next_base, may crash (incomplete),
    then prune. Invariants: every kept delta's base is kept and complete; the newest ``keep``
    complete checkpoints are kept; a base has at most full_every - 1 deltas."""
    entries: dict[int, Entry] = {}
    per_base: dict[int, int] = {}
    for step, crashed in enumerate(crashes, start=1):
        nxt = next_base(list(entries.values()), full_every)
        base = nxt[0] if nxt else None
        entries[step] = Entry(step, not crashed, base, nxt[1] if nxt else 0)
        if not crashed and base is not None:
            per_base[base] = per_base.get(base, 0) + 1
            assert per_base[base] <= full_every - 1
        if not crashed:
            for gone in to_remove(entries.values(), keep):
                del entries[gone]
        complete = sorted(s for s, e in entries.items() if e.complete)
        for e in entries.values():
            if e.complete and e.base is not None:
                assert e.base in entries and entries[e.base].complete
                assert entries[e.base].base is None
        done = [s for s, c in enumerate(crashes[:step], start=1) if not c]
        assert complete[-keep:] == done[-keep:]
    if full_every == 1:
        assert all(e.base is None for e in entries.values())


def test_next_base_counts_deltas_since_the_last_full() -> None:
    full, d = (lambda s: Entry(s, True)), (lambda s, b, i: Entry(s, True, b, i))
    assert next_base([], 3) is None
    assert next_base([full(1)], 3) == (1, 1)
    assert next_base([full(1), d(2, 1, 1)], 3) == (1, 2)
    assert next_base([full(1), d(3, 1, 2)], 3) is None  # delta 1 pruned: still counted
    assert next_base([full(1), d(2, 1, 1), d(3, 1, 2)], 3) is None
    assert next_base([full(1), Entry(2, False, 1, 1)], 2) == (1, 1)  # a crashed one: as if not
    assert next_base([d(5, 1, 1)], 3) is None  # its base is gone: full
    with pytest.raises(ValueError):
        next_base([], 0)
