"""What a pipeline task carries must not show credentials when Dask logs it."""

from __future__ import annotations

from pipeline.cleaning import CleaningConfig
from pipeline.readers import ReadOptions
from pipeline.tasks.stages import HiddenOptions, StageParams

SECRET = "wJalrXUtnFEMI-not-a-real-key"


def test_task_arguments_keep_storage_options_out_of_their_repr() -> None:
    options = {"key": "AKIDEXAMPLE", "secret": SECRET}
    params = StageParams(ReadOptions(), CleaningConfig(), True, False, (128, 16, 5), "0" * 64,
                         50257, 50256, 1024, 256 * 1024, False, options)
    hidden = HiddenOptions(options)
    for text in (repr(params), str(params), repr(hidden), repr((1, hidden, params))):
        assert SECRET not in text and "AKIDEXAMPLE" not in text
    assert params.storage_options == options and hidden.value == options  # still delivered


def _phase_one_of_a_small_partition(tmp_path):  # noqa: ANN001, ANN202
    import json

    from pipeline.tasks import tokenizing, work
    from pipeline.tasks.stages import phase_one
    from storage import ReplicaSet, tokenizer_name

    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps({"text": f"document {i} says something"}) + "\n"
                           for i in range(50)))
    (part,) = _partitions(tmp_path)
    tok = tokenizing.gpt2()
    store = ReplicaSet.from_urls([str(tmp_path / "ds")])
    store.put(tokenizer_name(tok.sha256), tok.json.encode())
    one = phase_one(part, "k0", store, _params())
    return store, one, tmp_path / "ds" / work.rows_path("k0")


def test_phase_two_links_a_shard_that_lost_no_rows(tmp_path) -> None:  # noqa: ANN001
    from pipeline.tasks.stages import phase_two

    store, one, rows = _phase_one_of_a_small_partition(tmp_path)
    two = phase_two(one, "run", store, 256 * 1024, 50257)
    shard = tmp_path / "ds" / two.shard.path
    assert shard.read_bytes() == rows.read_bytes()
    assert shard.stat().st_ino == rows.stat().st_ino  # linked, not written a second time


def test_phase_two_refuses_a_damaged_work_file(tmp_path) -> None:  # noqa: ANN001
    import pytest

    from pipeline.tasks.stages import phase_two
    from storage import ReplicaError

    store, one, rows = _phase_one_of_a_small_partition(tmp_path)
    data = bytearray(rows.read_bytes())
    data[len(data) // 2] ^= 0xFF
    rows.write_bytes(bytes(data))
    with pytest.raises(ReplicaError, match="checksum"):
        phase_two(one, "run", store, 256 * 1024, 50257)
    assert not list((tmp_path / "ds").glob("shards/*"))  # nothing damaged became a shard


def test_phase_one_reuses_verified_work_files_and_redoes_damaged_ones(tmp_path) -> None:  # noqa: ANN001
    """A power loss can keep a marker but not the unsynced files it describes: a rerun reuses
    the earlier result only when every work file matches the marker's checksums."""
    import dataclasses
    import json

    from pipeline.tasks import work
    from pipeline.tasks.stages import phase_one

    store, one, rows = _phase_one_of_a_small_partition(tmp_path)
    keys = tmp_path / "ds" / work.keys_path("k0")
    assert not one.durable and one.keys_sha256  # a local store: written without fsync
    earlier = work.PhaseOne.from_dict(json.loads(json.dumps(work.marker(one))))  # as stored
    good_rows, good_keys = rows.read_bytes(), keys.read_bytes()
    (part,) = _partitions(tmp_path)
    params = _params()

    again = phase_one(part, "k0", store, params, earlier)
    assert again is earlier and again.resumed  # verified, not redone

    for path, damage in ((rows, good_rows[: len(good_rows) // 2]), (keys, b"\0" * len(good_keys)),
                         (keys, None)):
        if damage is None:
            path.unlink()
        else:
            path.write_bytes(damage)
        redone = phase_one(part, "k0", store, params, earlier)
        assert not redone.resumed
        assert dataclasses.replace(redone, resumed=True) == earlier  # the same result again
        assert rows.read_bytes() == good_rows and keys.read_bytes() == good_keys


def _partitions(tmp_path):  # noqa: ANN001, ANN202
    from pipeline.planning.discovery import discover
    from pipeline.planning.plan import plan_partitions

    return plan_partitions(discover([str(tmp_path / "raw.jsonl")]), 1 << 20)


def _params():  # noqa: ANN202
    from pipeline.tasks import tokenizing

    tok = tokenizing.gpt2()
    return StageParams(ReadOptions(), CleaningConfig(), True, False, (128, 16, 5), tok.sha256,
                       tok.vocab_size, tok.eos_id, 1024, 256 * 1024, False, {})


def test_near_dup_phase_one_keeps_a_sketch_per_row_and_redoes_a_damaged_one(tmp_path) -> None:  # noqa: ANN001
    """With near-dup, phase 1 leaves each row's MinHash sketch (perms bytes) beside its keys;
    a rerun reuses the result only when the sketches match the marker's checksum, and redoes
    a result whose marker has none (a run without near-dup, or an older version)."""
    import dataclasses
    import json

    import numpy as np

    from pipeline.dedup import MinHasher
    from pipeline.tasks import tokenizing, work
    from pipeline.tasks.stages import needs_sketches, phase_one
    from storage import ReplicaSet, tokenizer_name

    raw = tmp_path / "raw.jsonl"
    texts = [" ".join(f"w{i * 7 + j}" for j in range(40)) for i in range(30)]
    raw.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (part,) = _partitions(tmp_path)
    params = dataclasses.replace(_params(), near_dup=True, minhash=(64, 8, 5, 4))
    store = ReplicaSet.from_urls([str(tmp_path / "ds")])
    store.put(tokenizer_name(params.tokenizer_sha256), tokenizing.gpt2().json.encode())
    one = phase_one(part, "n0", store, params)
    sketches = tmp_path / "ds" / work.sketches_path("n0")
    flat = work.parse_array(sketches.read_bytes())
    mh = MinHasher(64, 8, 5, rows=4)
    assert flat.dtype == np.uint8 and one.rows == len(texts) and one.sketches_sha256
    assert (flat.reshape(-1, 64)[3] == mh.keys_and_sketch(texts[3])[1]).all()
    earlier = work.PhaseOne.from_dict(json.loads(json.dumps(work.marker(one))))
    assert phase_one(part, "n0", store, params, earlier) is earlier  # verified, reused
    good = sketches.read_bytes()
    for damage in (good[:-10], None):
        if damage is None:
            sketches.unlink()
        else:
            sketches.write_bytes(damage)
        redone = phase_one(part, "n0", store, params, earlier)
        assert not redone.resumed and sketches.read_bytes() == good
    older = dataclasses.replace(earlier, sketches_sha256="")
    assert needs_sketches(older, params) and needs_sketches(work.marker(older), params)
    assert not phase_one(part, "n0", store, params, older).resumed
    assert not needs_sketches(older, _params())  # exact dedup alone needs none
