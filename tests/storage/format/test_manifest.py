import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import (
    DatasetNotFoundError,
    Manifest,
    ManifestError,
    RowGroupInfo,
    ShardInfo,
    TokenizerInfo,
    UnsafePathError,
    read_manifest,
    resolve,
    write_manifest,
)


def _manifest(path: str = "shards/part-00000.parquet") -> Manifest:
    shard = ShardInfo(path=path, rows=3, tokens=30, bytes=100, sha256="ab" * 32,
                      row_groups=(RowGroupInfo(2, 20), RowGroupInfo(1, 10)))
    tok = TokenizerInfo("gpt2", "tokenizer.json", "cd" * 32, 50257, 50256, "<|endoftext|>")
    return Manifest(tokenizer=tok, shards=(shard,), schema={"input_ids": "list<int32>"})


def test_round_trip_is_canonical(tmp_path: Path) -> None:
    m = _manifest()
    write_manifest(resolve(str(tmp_path)), m)
    text = (tmp_path / "manifest.json").read_text()
    assert read_manifest(str(tmp_path)) == m
    assert m.to_json() == text
    assert not list(tmp_path.glob(".tmp-*"))  # the temporary file was renamed over


def test_missing_manifest_means_no_dataset(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    with pytest.raises(DatasetNotFoundError, match="manifest.json is missing"):
        read_manifest(str(tmp_path))


@pytest.mark.parametrize("path", ["../outside.parquet", "s3://elsewhere/x.parquet", "/abs.parquet"])
def test_manifest_with_escaping_shard_path_is_rejected(tmp_path: Path, path: str) -> None:
    d = json.loads(_manifest().to_json())
    d["shards"][0]["path"] = path
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(UnsafePathError):
        read_manifest(str(tmp_path))


def test_inconsistent_counts_are_rejected(tmp_path: Path) -> None:
    d = json.loads(_manifest().to_json())
    d["shards"][0]["tokens"] = 31
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="do not add up"):
        read_manifest(str(tmp_path))


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: [1, 2, 3], "top level must be an object"),
    (lambda d: None, "top level must be an object"),
    (lambda d: "manifest", "top level must be an object"),
    (lambda d: {**d, "shards": None}, "shards must be a list, not null"),
    (lambda d: {**d, "shards": [7]}, r"shards\[0\] must be an object"),
    (lambda d: {**d, "tokenizer": []}, "tokenizer must be an object, not a list"),
    (lambda d: {**d, "schema": {"input_ids": 3}}, "schema.input_ids must be a string"),
    (lambda d: {**d, "stats": [1]}, "stats must be an object"),
])
def test_wrong_shapes_name_the_file_and_field(tmp_path: Path, mutate, field: str) -> None:
    d = mutate(json.loads(_manifest().to_json()))
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match=field) as info:
        read_manifest(str(tmp_path))
    assert "manifest.json" in str(info.value)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("rows", "3", r"shards\[0\]\.rows must be an integer, not a string"),
    ("rows", True, r"shards\[0\]\.rows must be an integer, not a boolean"),
    ("rows", -1, r"shards\[0\]\.rows must be >= 0"),
    ("bytes", 1.5, r"shards\[0\]\.bytes must be an integer, not a number"),
    ("sha256", "xyz", r"shards\[0\]\.sha256 must be 64 lower-case hex digits"),
    ("row_groups", {"rows": 1}, r"shards\[0\]\.row_groups must be a list"),
    ("path", 5, r"shards\[0\]\.path must be a string"),
])
def test_wrong_field_types_name_the_field(tmp_path: Path, key: str, value, message: str) -> None:
    d = json.loads(_manifest().to_json())
    d["shards"][0][key] = value
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match=message):
        read_manifest(str(tmp_path))


def test_row_group_field_errors_carry_the_full_path(tmp_path: Path) -> None:
    d = json.loads(_manifest().to_json())
    d["shards"][0]["row_groups"][1]["tokens"] = None
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match=r"shards\[0\]\.row_groups\[1\]\.tokens must be an "
                                            r"integer, not null"):
        read_manifest(str(tmp_path))


def test_missing_field_is_named(tmp_path: Path) -> None:
    d = json.loads(_manifest().to_json())
    del d["tokenizer"]["vocab_size"]
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match=r"tokenizer\.vocab_size is missing"):
        read_manifest(str(tmp_path))


def test_unsafe_path_error_names_the_file_and_field(tmp_path: Path) -> None:
    d = json.loads(_manifest().to_json())
    d["shards"][0]["path"] = "../x.parquet"
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(UnsafePathError, match=r"manifest.json: shards\[0\]\.path"):
        read_manifest(str(tmp_path))


@pytest.mark.parametrize("field", ["reports", "drops", "quarantine"])
def test_a_report_or_drop_record_outside_the_dataset_is_refused(tmp_path: Path,
                                                                 field: str) -> None:
    d = json.loads(_manifest().to_json())
    hostile = {"path": "../../etc/passwd", "bytes": 1, "sha256": "0" * 64}
    d[field] = hostile if field == "drops" else [hostile]  # drops: the one list's object
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    where = r"drops\.path" if field == "drops" else rf"{field}\[0\]\.path"
    with pytest.raises(UnsafePathError, match=rf"manifest.json: {where}"):
        read_manifest(str(tmp_path))


@pytest.mark.parametrize("line", [b'{"path": "../x", "bytes": 1, "sha256": "%s"}' % (b"0" * 64),
                                  b"not json", b'{"path": "lineage/a", "bytes": "1"}', b"\xff"])
def test_a_hostile_object_list_is_refused_naming_its_line(line: bytes) -> None:
    from storage.format.object_list import parse_objects

    good = b'{"path": "lineage/a", "bytes": 1, "sha256": "%s"}' % (b"0" * 64)
    with pytest.raises(ValueError, match=r"lineage/drops-x\.jsonl"):
        parse_objects(good + b"\n" + line + b"\n", "lineage/drops-x.jsonl")
    assert len(parse_objects(good + b"\n", "lineage/drops-x.jsonl")) == 1


def test_reports_are_objects_of_the_version_and_absent_when_none() -> None:
    m = _manifest()
    assert "reports" not in json.loads(m.to_json())  # older manifests keep their bytes
    from dataclasses import replace

    from storage.format.manifest import ObjectInfo

    r = ObjectInfo("contamination/0123456789abcdef.json", 10, "a" * 64)
    m2 = Manifest.from_json(replace(m, reports=(r,)).to_json())
    assert m2.reports == (r,) and (r.path, 10, "a" * 64) in m2.objects()


def test_binary_garbage_is_a_manifest_error(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ManifestError, match="manifest.json"):
        read_manifest(str(tmp_path))


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(where=st.sampled_from(["", "tokenizer", "shards", "row_groups", "schema", "quarantine"]),
       key=st.sampled_from(["rows", "tokens", "path", "sha256", "bytes", "name", "vocab_size",
                            "eos_id", "offset", "row_groups", "format", "input_ids"]),
       value=_JSON)
def test_any_mutation_is_accepted_or_refused_cleanly(where: str, key: str, value) -> None:
    """Whatever a hostile writer puts in a field, parsing raises only ManifestError or
    UnsafePathError (never AttributeError/TypeError/KeyError from inside the parser)."""
    d = json.loads(_manifest().to_json())
    target = {"": d, "tokenizer": d["tokenizer"], "shards": d["shards"][0],
              "row_groups": d["shards"][0]["row_groups"][0], "schema": d["schema"],
              "quarantine": d}[where]
    target[key] = value
    try:
        Manifest.from_json(json.dumps(d))
    except (ManifestError, UnsafePathError) as exc:
        assert "manifest.json" in str(exc)


def test_a_shards_codec_is_kept_and_an_absent_one_is_not_written(tmp_path: Path) -> None:
    """A v1 manifest written before shards had a codec re-serialises to its own bytes; one
    with it keeps it; a codec this version cannot decode without the footer is refused."""
    plain = _manifest()
    assert '"codec"' not in plain.to_json()
    m = _manifest()
    m = Manifest(tokenizer=m.tokenizer, schema=m.schema,
                 shards=(ShardInfo(**{**m.shards[0].__dict__, "codec": "ZSTD"}),))
    assert Manifest.from_json(m.to_json()) == m and '"codec": "ZSTD"' in m.to_json()
    bad = json.loads(m.to_json())
    bad["shards"][0]["codec"] = "LZO"
    with pytest.raises(ManifestError, match=r"shards\[0\]\.codec must be one of"):
        Manifest.from_json(json.dumps(bad))
