import pytest

from storage import UnsafePathError, digest_bytes, safe_relative, shard_name, tokenizer_name


@pytest.mark.parametrize("bad", ["../secret", "shards/../../x", "/etc/passwd", "s3://other/x",
                                 "file:///etc/passwd", "shards//a", "./a", "", "a\\..\\b"])
def test_paths_leaving_the_root_are_refused(bad: str) -> None:
    with pytest.raises(UnsafePathError):
        safe_relative(bad)


def test_plain_relative_paths_pass() -> None:
    sha = digest_bytes(b"shard bytes")
    assert safe_relative(shard_name(7, sha)) == f"shards/part-00007-{sha[:16]}.parquet"
    assert safe_relative(tokenizer_name(sha)) == f"tokenizer-{sha[:16]}.json"


def test_names_are_made_from_content() -> None:
    a, b = digest_bytes(b"a"), digest_bytes(b"b")
    assert shard_name(0, a) == shard_name(0, a) != shard_name(0, b)
    for bad in ("", "xyz", a[:15], a.upper()):
        with pytest.raises(ValueError):
            shard_name(0, bad)
