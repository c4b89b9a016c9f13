"""Verifying LSH candidates on MinHash sketches: pure, deterministic, and as good as the
Jaccard similarity the sketches estimate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.dedup import MinHasher, sketch, verify


@settings(max_examples=200)
@given(st.integers(1, 300), st.floats(0.01, 1.0), st.data())
def test_min_matches_is_the_estimate_reaching_the_threshold(perms: int, threshold: float,
                                                            data) -> None:
    """The integer rule every worker applies is the estimate's: m agreeing values pass
    exactly when (m / perms - 1/256) / (1 - 1/256) >= threshold (up to float rounding)."""
    need = verify.min_matches(perms, threshold)
    m = data.draw(st.integers(0, perms))
    est = (m / perms - verify.CHANCE) / (1 - verify.CHANCE)
    if abs(est - threshold) > 1e-9:
        assert (m >= need) == (est >= threshold)
    a = np.zeros((1, perms), np.uint8)
    b = a.copy()
    b[0, m:] = 1  # m agree
    assert verify.verified(a, b, threshold).tolist() == [m >= need]
    assert verify.verified(b, a, threshold).tolist() == [m >= need]  # symmetric


def test_thresholds_outside_0_1_are_refused() -> None:
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="threshold"):
            verify.min_matches(256, bad)
    with pytest.raises(ValueError, match="21 bands x 13 rows"):
        MinHasher(256, 21, rows=13)


def _shingle_set(words: list[str], k: int = 5) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + k]) for i in range(len(words) - k + 1)}


def test_sketches_estimate_the_jaccard_of_the_shingles() -> None:
    """Over pairs of edited documents, the sketches' estimate tracks the exact Jaccard of the
    5-word shingles (256 values: standard deviation ~0.03 at J = 0.7), and the keys and
    sketch come from one signature (the band keys are those of band_keys)."""
    rng = np.random.default_rng(7)
    mh = MinHasher()
    errors = []
    for _ in range(40):
        words = [f"w{i}" for i in rng.integers(0, 5000, 300)]
        other = [w if rng.random() > 0.04 else f"x{rng.integers(10**6)}" for w in words]
        ka, sa = mh.keys_and_sketch(" ".join(words))
        kb, sb = mh.keys_and_sketch(" ".join(other))
        assert ka == mh.band_keys(" ".join(words)) and len(ka) == 21 and sa.shape == (256,)
        assert (sa == sketch(mh.signature(" ".join(words)))).all()
        x, y = _shingle_set(words), _shingle_set(other)
        exact = len(x & y) / len(x | y)
        errors.append(float(verify.estimate(sa[None], sb[None])[0]) - exact)
    assert abs(np.mean(errors)) < 0.02 and np.std(errors) < 0.05


def test_rows_of_find_documents_in_a_groups_sketch_matrix() -> None:
    offsets = np.array([0, 3, 3, 10])  # partitions 5..8 with 3, 0, 7, ... rows
    rows = verify.rows_of(np.array([5, 7, 8, 5]), np.array([2, 6, 0, 0]), 5, offsets)
    assert rows.tolist() == [2, 9, 10, 0]
