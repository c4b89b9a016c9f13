import pytest

from storage import UnsafePathError, safe_relative, shard_name


@pytest.mark.parametrize("bad", ["../secret", "shards/../../x", "/etc/passwd", "s3://other/x",
                                 "file:///etc/passwd", "shards//a", "./a", "", "a\\..\\b"])
def test_paths_leaving_the_root_are_refused(bad: str) -> None:
    with pytest.raises(UnsafePathError):
        safe_relative(bad)


def test_plain_relative_paths_pass() -> None:
    assert safe_relative(shard_name(7)) == "shards/part-00007.parquet"
