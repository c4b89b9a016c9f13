"""Views' format (pure): the keep-masks object round-trips any masks, refuses crafted bytes,
and counts what a view keeps; the manifest's view record refuses a source outside the
sibling folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import UnsafePathError
from storage.format.layout import doclens_name, doclens_shard
from storage.format.manifest import Manifest, ManifestError
from storage.format.view import (
    MaskFormatError,
    Masks,
    ViewRef,
    decode_lengths,
    encode_lengths,
    encode_masks,
    kept_counts,
    kept_tokens,
    source_name,
)

groups = st.lists(st.lists(st.booleans(), max_size=40), max_size=12)


@settings(max_examples=300, deadline=None)
@given(groups)
def test_masks_round_trip_and_count_what_they_keep(keep: list[list[bool]]) -> None:
    rows = [len(k) for k in keep]
    toks = [7 * r for r in rows]
    data = encode_masks(rows, toks, [np.array(k, dtype=bool) for k in keep])
    assert data == encode_masks(rows, toks, [np.array(k, dtype=bool) for k in keep])
    masks = Masks(data)
    assert len(masks) == len(keep)
    assert masks.source_rows.tolist() == rows and masks.source_tokens.tolist() == toks
    for g, k in enumerate(keep):
        assert masks.group(g).tolist() == k
    assert masks.kept_rows().tolist() == [sum(k) for k in keep]
    # an empty group keeps all of none
    assert [masks.keeps_all(g) for g in range(len(keep))] == [all(k) for k in keep]


@settings(max_examples=200, deadline=None)
@given(groups, st.data())
def test_kept_tokens_are_the_kept_documents_tokens(keep: list[list[bool]], data) -> None:  # noqa: ANN001
    lengths = [np.array(data.draw(st.lists(st.integers(0, 50), min_size=len(k),
                                           max_size=len(k))), dtype=np.int64) for k in keep]
    toks = [int(x.sum()) for x in lengths]
    masks = Masks(encode_masks([len(k) for k in keep], toks,
                               [np.array(k, dtype=bool) for k in keep]))
    # a group kept whole or dropped whole needs no lengths: its tokens are the source's or 0
    given_lengths = [None if all(k) or not any(k) else x for k, x in zip(keep, lengths,
                                                                          strict=True)]
    rows, kept = kept_counts(masks, given_lengths)
    assert rows.tolist() == [sum(k) for k in keep]
    assert kept.tolist() == [int(x[np.array(k, dtype=bool)].sum()) if len(k) else 0
                             for k, x in zip(keep, lengths, strict=True)]


def _masks() -> bytes:
    return encode_masks([5, 9], [10, 18], [np.array([1, 0, 1, 0, 1], bool),
                                           np.ones(9, bool)])


@pytest.mark.parametrize("crafted", [
    lambda d: b"XXXXXXXX" + d[8:],                    # magic
    lambda d: d[:-1],                                 # a byte short
    lambda d: d + b"\0",                              # a byte more
    lambda d: d[:16] + b"[" + d[17:],                 # header not a JSON object
    lambda d: d[:8] + (10**6).to_bytes(8, "little") + d[16:],  # header longer than the object
])
def test_crafted_masks_are_refused(crafted) -> None:  # noqa: ANN001
    with pytest.raises(MaskFormatError):
        Masks(crafted(_masks()))


def test_a_bit_past_a_groups_rows_is_refused() -> None:
    data = bytearray(_masks())
    # group 0 has 5 rows: its byte is the first of the bits (2 groups x 8 bytes before)
    at = len(data) - 3
    data[at] |= 0x80
    with pytest.raises(MaskFormatError, match="row group 0 keeps documents past its 5 rows"):
        Masks(bytes(data))


@pytest.mark.parametrize("bad", ["../web", "a/b", "/abs", "s3://other/web", ".", "", "..",
                                 "file:///etc"])
def test_a_source_outside_the_sibling_folder_is_refused(bad: str) -> None:
    with pytest.raises(UnsafePathError):
        source_name(bad)
    assert source_name("web") == "web"


def _view_manifest(**view: object) -> str:
    sha = "ab" * 32
    record = {"source": "web", "source_version": sha, "where": "lang = 'en'",
              "source_rows": 10, "source_tokens": 100,
              "masks": {"path": "masks/abababababababab.sfmask", "bytes": 40, "sha256": sha}}
    record.update(view)
    return json.dumps({
        "format": "shardflow.dataset/2", "schema": {"input_ids": "binary<uint16le>"},
        "tokenizer": {"name": "t", "path": "tokenizer-abababababababab.json", "sha256": sha,
                      "vocab_size": 10, "eos_id": None, "eos_token": None, "bytes": 5},
        "index": {"path": "index/abababababababab.sfidx", "bytes": 100, "sha256": sha,
                  "header_sha256": sha},
        "totals": {"shards": 1, "row_groups": 1, "rows": 5, "tokens": 50, "bytes": 500},
        "view": record})


def test_a_view_manifest_round_trips_and_names_only_its_own_objects() -> None:
    m = Manifest.from_json(_view_manifest())
    assert isinstance(m.view, ViewRef) and m.view.source == "web"
    assert Manifest.from_json(m.to_json()) == m
    assert [p for p, _, _ in m.objects()] == ["index/abababababababab.sfidx",
                                              "masks/abababababababab.sfmask"]
    assert [p for p, _, _ in m.source_objects()] == ["tokenizer-abababababababab.json"]


@pytest.mark.parametrize("view,error", [
    ({"source": "../web"}, UnsafePathError), ({"source": "s3://other-bucket/web"}, UnsafePathError),
    ({"source": "d/web"}, UnsafePathError),
    ({"masks": {"path": "../masks/x", "bytes": 4, "sha256": "ab" * 32}}, UnsafePathError),
    ({"source_version": "nothex"}, ManifestError), ({"where": 5}, ManifestError),
])
def test_hostile_view_records_are_refused(view: dict, error: type) -> None:
    with pytest.raises(error):
        Manifest.from_json(_view_manifest(**view))


def test_a_dataset_manifest_has_no_view_key() -> None:
    m = Manifest.from_json(_view_manifest())
    plain = json.loads(m.to_json())
    del plain["view"]
    assert "view" not in json.loads(Manifest.from_json(json.dumps(plain)).to_json())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.booleans()), max_size=40))
def test_kept_tokens_are_the_kept_documents_end_to_end(docs: list[tuple[int, bool]]) -> None:
    lengths = np.array([n for n, _ in docs], dtype=np.int64)
    keep = np.array([k for _, k in docs], dtype=bool)
    ids = np.arange(int(lengths.sum()), dtype=np.uint16)
    parts, at = [], 0
    for n, k in docs:
        if k:
            parts.append(ids[at:at + n])
        at += n
    want = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
    assert kept_tokens(ids, lengths, keep).tolist() == want.tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5000), max_size=20), max_size=8))
def test_cached_token_counts_round_trip_and_must_add_up(groups: list[list[int]]) -> None:
    rows = np.array([len(g) for g in groups], dtype=np.int64)
    toks = np.array([sum(g) for g in groups], dtype=np.int64)
    data = encode_lengths(np.array([x for g in groups for x in g], dtype=np.int64))
    got = decode_lengths(data, rows, toks)
    assert got is not None and [x.tolist() for x in got] == groups
    assert decode_lengths(data[:-1], rows, toks) is None
    assert decode_lengths(b"XXXXXXXX" + data[8:], rows, toks) is None
    if len(groups) and rows.sum():
        assert decode_lengths(data, rows, toks + np.eye(len(groups), dtype=np.int64)[0]) is None


def test_a_token_count_cache_is_named_after_its_shard() -> None:
    shard = "shards/part-00007-0123456789abcdef.parquet"
    assert doclens_name(shard) == "_doclens/part-00007-0123456789abcdef.u4"
    assert doclens_shard(doclens_name(shard)) == shard
    assert doclens_shard("_doclens/x.json") is None and doclens_shard("shards/a.u4") is None
