"""Windows -> int64 batches: exact values whatever the windows' dtypes, empty parts allowed."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from loaders.batches import BatchFormat, batches, make_batch

SEQ = 6


@given(st.lists(st.tuples(st.sampled_from(["<u2", "<u4", "<i4"]),
                          st.integers(0, 2**31 - 1)), min_size=0, max_size=12),
       st.data())
def test_batches_are_the_windows_widened_exactly(specs, data) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(len(specs))
    windows = []
    for dtype, seed in specs:
        top = min(np.iinfo(dtype).max, 2**31 - 1)
        windows.append(np.random.default_rng(seed).integers(0, top, SEQ + 1).astype(dtype))
    sizes, left = [], len(windows)
    while left:
        size = data.draw(st.integers(0, left))
        sizes.append(size)
        left -= size
    sizes.append(0)  # an empty part at the end, as a DataLoader worker may have
    samples = rng.integers(0, 1000, len(windows))
    fmt = BatchFormat(SEQ, return_sample_id=True)
    got = list(batches(fmt, samples, (w for w in windows), sizes))
    assert [len(b["input_ids"]) for b in got] == sizes
    lo = 0
    for batch, size in zip(got, sizes, strict=True):
        want = make_batch(fmt, samples[lo:lo + size], windows[lo:lo + size])
        for key in ("input_ids", "labels", "sample_id"):
            assert batch[key].dtype == want[key].dtype
            assert batch[key].tolist() == want[key].tolist()
        for i, w in enumerate(windows[lo:lo + size]):  # against the windows themselves
            assert batch["input_ids"][i].tolist() == [int(x) for x in w[:-1]]
            assert batch["labels"][i].tolist() == [int(x) for x in w[1:]]
        lo += size
