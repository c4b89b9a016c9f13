"""Card file names (``card/<manifest sha16>/<file>``): made from a version's manifest sha256,
parsed back by gc, and nothing else parses as one (a path that climbs out, another folder,
a nested name)."""

from __future__ import annotations

import pytest

from storage.format.layout import card_name, card_tag, safe_relative

SHA = "0123456789abcdef" + "0" * 48


def test_a_card_file_is_named_by_its_version_and_parsed_back() -> None:
    name = card_name(SHA, "README.md")
    assert name == "card/0123456789abcdef/README.md" == safe_relative(name)
    assert card_tag(name) == "0123456789abcdef"
    assert card_tag(card_name(SHA, "flow.png")) == "0123456789abcdef"


@pytest.mark.parametrize("path", [
    "card/README.md", "card/0123456789abcdef", "card/0123456789ABCDEF/README.md",
    "card/0123456789abcdef/../x", "card/0123456789abcdef/a/b.png", "cards/0123456789abcdef/x",
    "card/0123456789abcde/README.md", "card/0123456789abcdef/.hidden", "shards/x.parquet"])
def test_nothing_else_is_a_card_file(path: str) -> None:
    assert card_tag(path) is None


@pytest.mark.parametrize("file", ["", ".", "..", "a/b", "../x", "x" * 65, "a b"])
def test_bad_file_names_are_refused(file: str) -> None:
    with pytest.raises(ValueError):
        card_name(SHA, file)
