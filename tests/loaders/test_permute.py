"""The keyed random-access permutation: a bijection, invertible, keyed, well mixed."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.permute import Feistel, RunPermutation, hash32, seed_state

keys = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=3)


@settings(max_examples=300)
@given(st.integers(0, 5000), keys)
def test_feistel_is_a_bijection_with_its_inverse(n: int, key: list[int]) -> None:
    f = Feistel(n, key)
    image = f(np.arange(n))
    assert sorted(image.tolist()) == list(range(n))  # brute force: every index once
    assert f.inverse(image).tolist() == list(range(n))
    assert f.inverse(np.arange(n))[image].tolist() == list(range(n)) if n else True


@settings(max_examples=200)
@given(st.integers(0, 3000), st.integers(1, 9), keys)
def test_run_permutation_moves_whole_runs_and_pads_only_the_last(blocks: int, run: int,
                                                                 key: list[int]) -> None:
    p = RunPermutation(blocks, run, key)
    assert p.n % run == 0 and blocks <= p.n < blocks + run
    image = p(np.arange(p.n))
    assert sorted(image.tolist()) == list(range(p.n))  # a bijection of the padded domain
    assert p.inverse(image).tolist() == list(range(p.n))
    runs = image.reshape(-1, run)  # each run of indices is a run of consecutive blocks
    assert (runs[:, 0] % run == 0).all() and (np.diff(runs, axis=1) == 1).all()
    assert np.array_equal(runs[:, 0] // run, Feistel(p.runs, key)(np.arange(p.runs)))
    if run == 1:
        assert np.array_equal(image, Feistel(blocks, key)(np.arange(blocks)))


@given(st.integers(2, 3000), keys, st.data())
def test_random_access_agrees_with_the_whole_array(n: int, key: list[int], data) -> None:
    f = Feistel(n, key)
    whole = f(np.arange(n))
    picks = data.draw(st.lists(st.integers(0, n - 1), max_size=20))
    assert f(np.array(picks, dtype=np.int64)).tolist() == whole[picks].tolist()
    assert all(int(f(i)) == whole[i] for i in picks[:5])


def test_keys_give_different_permutations_and_mix_well() -> None:
    n = 10_000
    a, b = Feistel(n, (1, 0))(np.arange(n)), Feistel(n, (1, 1))(np.arange(n))
    assert not np.array_equal(a, b)
    assert abs(np.corrcoef(np.arange(n), a)[0, 1]) < 0.05  # no trace of the identity
    assert (a == np.arange(n)).sum() < 10  # about one fixed point expected
    # Neighbours in the input land far apart (a permutation of blocks, not a rotation).
    assert np.median(np.abs(np.diff(a))) > n / 10


def test_out_of_range_is_refused() -> None:
    import pytest

    with pytest.raises(IndexError):
        Feistel(10, (1,))(np.array([10]))


def test_hash32_is_keyed_and_32_bit() -> None:
    x = np.arange(1000)
    h = hash32(x, (1, 2))
    assert h.max() < 2**32 and len(set(h.tolist())) == 1000
    assert not np.array_equal(h, hash32(x, (1, 3)))


@settings(max_examples=200)
@given(st.integers(0, 1 << 33), keys, st.data())
def test_round_tables_give_the_defining_arithmetic(n: int, key: list[int], data) -> None:
    """The tabulated rounds (domains up to 2**32) are the 64-bit definition, bit for bit,
    both ways; a larger domain computes the definition itself."""
    f = Feistel(n, key)
    assert (f._tables is not None) == (max(2, (n - 1).bit_length()) <= 32) or n <= 1
    size = data.draw(st.integers(0, min(n, 300)))
    picks = np.array(data.draw(st.lists(st.integers(0, max(0, n - 1)), min_size=size,
                                        max_size=size)) if n else [], dtype=np.int64)
    image = f(picks)
    assert np.array_equal(image, f.reference(picks))
    assert np.array_equal(f.inverse(image), picks)
    assert np.array_equal(f.reference(image, inverse=True), picks)


@settings(max_examples=300)
@given(st.lists(st.integers(0, 2**80), min_size=1, max_size=7), st.integers(1, 6))
def test_seed_state_is_numpys_seed_sequence(key: list[int], count: int) -> None:
    """The keys come from NumPy's seeding algorithm, computed without numpy.random (whose
    import cost a first batch ~10 ms): the same words for any key, short or long."""
    want = np.random.SeedSequence(key).generate_state(count, np.uint64).tolist()
    assert seed_state(key, count) == want
