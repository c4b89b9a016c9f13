"""The step contract as the chain enforces it: what a step returns is counted (``<name>``,
``<name>.<reason>``), its signals become typed columns ``<name>.<key>``, a step that raises
poisons only its document, and one that breaks the contract is one error naming it."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from pipeline.records import Document
from pipeline.steps.chain import StepChain
from pipeline.steps.contract import Doc, Poisoned, StepError
from pipeline.steps.recipe import Recipe, spec

HERE = "tests.pipeline.steps.test_chain"


class Tagger:
    """Counts a word, drops documents without it (or with ``skip``), upper-cases ``shout``."""

    name = "tagger"
    version = "1"

    def __init__(self, word: str = "the") -> None:
        self.word = word

    def __call__(self, doc: Doc) -> Any:
        words = doc.text.lower().split()
        doc.signals["count"] = words.count(self.word)
        doc.signals["first"] = words[0] if words else ""
        doc.signals["ratio"] = words.count(self.word) / max(1, len(words))
        if "skip" in words:
            return None, "skip"
        if self.word not in words:
            return None
        if "shout" in words:
            doc.text = doc.text.upper()
        return doc


class Misbehaves:
    name = "bad"
    version = "1"

    def __call__(self, doc: Doc) -> Any:
        kind = doc.text.split()[0]
        if kind == "raise":
            raise KeyError("missing")
        if kind == "int":
            return 7
        if kind == "text":
            doc.text = b"bytes"  # type: ignore[assignment]
            return doc
        if kind == "signal":
            doc.signals["x"] = [1, 2]
            return doc
        if kind == "str":
            doc.signals["n"] = "seven"
            return doc
        doc.signals["n"] = 1
        return doc


def _chain(*specs: Any) -> StepChain:
    return StepChain(Recipe(tuple(specs)))


def _docs(*texts: str) -> list[Document]:
    return [Document(f"d{i}", t, url=f"https://x/{i}") for i, t in enumerate(texts)]


def _run(chain: StepChain, docs: list[Document]) -> tuple[list[str | None], dict[str, Any]]:
    columns = chain.columns()
    out = []
    for d in docs:
        text = chain(d)
        if text is not None:
            columns.add(*chain.last)
        out.append(text)
    taken = columns.take()
    return out, {k: v.to_pylist() if isinstance(v, pa.Array) else v
                 for k, v in (taken or {}).items()}


def test_results_are_counted_and_signals_prefixed_by_the_recipe_name() -> None:
    chain = _chain(spec("clean"), spec(f"{HERE}:Tagger", "tag", word="the"))
    texts, columns = _run(chain, _docs("the cat  sat", "a dog", "skip the rest",
                                        "shout the news", "   "))
    assert texts == ["the cat sat", None, None, "SHOUT THE NEWS", None]
    assert dict(chain.dropped) == {"tag": 1, "tag.skip": 1, "empty": 1}
    assert chain.changed["tag"] == 1 and chain.changed["whitespace"] == 2
    assert columns == {"tag.count": [1, 1], "tag.first": ["the", "shout"],
                       "tag.ratio": [1 / 3, 1 / 3]}


def test_annotate_mode_keeps_everything_and_writes_the_drop_it_would_have_made() -> None:
    chain = _chain(spec(f"{HERE}:Tagger", "tag", "annotate"))
    texts, columns = _run(chain, _docs("the cat", "a dog", "skip it", "shout the news"))
    assert texts == ["the cat", "a dog", "skip it", "shout the news"]  # nor changes
    assert not chain.dropped
    assert columns["tag.drop"] == ["", "tag", "tag.skip", ""]
    assert columns["tag.count"] == [1, 0, 0, 1]


def test_a_step_that_raises_poisons_only_that_document() -> None:
    chain = _chain(spec(f"{HERE}:Misbehaves"))
    with pytest.raises(Poisoned) as caught:
        chain(_docs("raise now")[0])
    assert (caught.value.reason, caught.value.detail) == ("misbehaves.error",
                                                           "KeyError: 'missing'")
    assert chain(_docs("fine words")[0]) == "fine words"


@pytest.mark.parametrize("text, message", [
    ("int", "step 'misbehaves' returned int"),
    ("text", "step 'misbehaves' set the text to a bytes, not a str"),
])
def test_breaking_the_contract_is_an_error_naming_the_step(text: str, message: str) -> None:
    with pytest.raises(StepError, match=message):
        _chain(spec(f"{HERE}:Misbehaves"))(_docs(text)[0])


def test_signal_types_are_checked_and_fixed_with_the_first_batch() -> None:
    chain = _chain(spec(f"{HERE}:Misbehaves"))
    columns = chain.columns()
    chain(_docs("signal")[0])
    with pytest.raises(StepError, match="signal 'misbehaves.x' of type list"):
        columns.add(*chain.last)
    chain(_docs("ok")[0])
    columns.add(*chain.last)  # n: int
    chain(_docs("str")[0])
    with pytest.raises(StepError, match="wrote signal 'misbehaves.n' as str after int"):
        columns.add(*chain.last)
    columns.take()
    late = chain.columns()
    late.take()  # the shard's columns fixed with no signal in its first batch
    chain(_docs("ok")[0])
    with pytest.raises(StepError, match="first after this shard's columns were fixed"):
        late.add(*chain.last)


def test_an_int_then_a_float_makes_a_float_column() -> None:
    from pipeline.steps.columns import Columns

    columns = Columns(False)
    for value in (1, 2.5, 3):
        columns.add(None, {"s.v": value})
    taken = columns.take()
    assert taken is not None and taken["s.v"].type == pa.float64()
    assert taken["s.v"].to_pylist() == [1.0, 2.5, 3.0]


def test_metadata_is_read_only_for_a_step() -> None:
    doc = Doc("id", "text", {"url": "https://x/"})
    assert doc.meta["url"] == "https://x/" and doc.meta["lang"] is None
    with pytest.raises(TypeError):
        doc.meta["url"] = "https://evil/"  # type: ignore[index]


def test_the_length_step_counts_and_filters() -> None:
    texts, columns = _run(_chain(spec("length", mode="annotate")),
                          _docs("one two\nthree", "a"))
    assert texts == ["one two\nthree", "a"]
    assert columns == {"length.n_chars": [13, 1], "length.n_words": [3, 1],
                       "length.n_lines": [2, 1]}
    chain = _chain(spec("length", min_words=2, max_words=3))
    texts, columns = _run(chain, _docs("one two", "a", "a b c d"))
    assert texts == ["one two", None, None] and columns == {}
    assert dict(chain.dropped) == {"length.too_few_words": 1, "length.too_many_words": 1}
