"""A step's batch method: the same results as one document at a time (kept, dropped, changed,
signals, in order), a batch that raises falls back to one document at a time so exactly the
failing documents are quarantined, and a batch that breaks the contract names the step."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.records import Document
from pipeline.steps.chain import StepChain
from pipeline.steps.contract import Doc, Poisoned, StepError
from pipeline.steps.recipe import Recipe, spec
from pipeline.tasks.record_steps import BATCH_DOCS, RecordSteps

HERE = "tests.pipeline.steps.test_chain_batches"
#: how many documents each BatchTagger.batch call got (this process only)
CALLS: list[int] = []


class BatchTagger:
    """Counts ``the``; drops documents without it, or with ``skip`` (reason), upper-cases
    ``shout``; raises on ``boom`` (one at a time and in a batch holding it)."""

    name = "btag"
    version = "1"

    def __call__(self, doc: Doc) -> Any:
        words = doc.text.lower().split()
        if "boom" in words:
            raise RuntimeError("boom")
        doc.signals["count"] = words.count("the")
        if "skip" in words:
            return None, "skip"
        if "the" not in words:
            return None
        if "shout" in words:
            doc.text = doc.text.upper()
        return doc

    def batch(self, docs: list[Doc]) -> list[Any]:
        CALLS.append(len(docs))
        if any("boom" in d.text.split() for d in docs):
            docs[0].text = "half-done"  # what a batch left behind must not leak
            docs[0].signals["count"] = -1
            raise RuntimeError("one of them")
        return [self(d) for d in docs]


class PlainTagger(BatchTagger):
    """The same step without a batch method."""

    batch = None  # type: ignore[assignment]


class ShortBatch(BatchTagger):
    def batch(self, docs: list[Doc]) -> list[Any]:
        return [self(d) for d in docs[1:]]


class Upper:
    name = "upper"
    version = "1"

    def __call__(self, doc: Doc) -> Doc:
        doc.text = doc.text.upper()
        doc.signals["len"] = len(doc.text)
        return doc


def _docs(texts: list[str]) -> list[Document]:
    return [Document(f"d{i}", t, url=f"https://x/{i}") for i, t in enumerate(texts)]


def _one_at_a_time(chain: StepChain, docs: list[Document]) -> list[Any]:
    out: list[Any] = []
    for d in docs:
        try:
            out.append((chain(d), chain.last if chain.last else None))
        except Poisoned as bad:
            out.append(bad.reason)
    return out


def _batched(chain: StepChain, docs: list[Document]) -> list[Any]:
    out: list[Any] = []
    for outcome in chain.run(docs):
        try:
            out.append((chain.settle(outcome), chain.last))
        except Poisoned as bad:
            out.append(bad.reason)
    return out


def _recipe(step: str) -> Recipe:
    return Recipe((spec(f"{HERE}:{step}", "tag"), spec(f"{HERE}:Upper")))


WORDS = st.sampled_from(["the", "cat", "skip", "shout", "boom", "a"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(WORDS, max_size=5).map(" ".join), min_size=0, max_size=12))
def test_a_batch_gives_what_one_document_at_a_time_gives(texts: list[str]) -> None:
    docs = _docs(texts)
    plain, batched = StepChain(_recipe("PlainTagger")), StepChain(_recipe("BatchTagger"))
    expected = _one_at_a_time(plain, docs)
    got = _batched(batched, docs)
    for e, g in zip(expected, got, strict=True):  # a dropped document leaves last unchanged
        assert e == g if isinstance(e, str) or e[0] is not None else g[0] is None
    assert batched.dropped == plain.dropped
    assert batched.changed == plain.changed


def test_a_raising_batch_quarantines_exactly_the_failing_documents() -> None:
    CALLS.clear()
    chain = StepChain(_recipe("BatchTagger"))
    got = _batched(chain, _docs(["the cat", "boom the", "shout the", "a dog", "the boom"]))
    assert got[1] == got[4] == "tag.error"
    assert got[0][0] == "THE CAT" and got[0][1][1] == {"tag.count": 1, "upper.len": 7}
    assert got[2][0] == "SHOUT THE"  # not "half-done": the batch's leftovers were undone
    assert got[3][0] is None and chain.dropped == {"tag": 1}
    assert CALLS == [5]  # one batch call, then each document alone


def test_a_batch_of_the_wrong_length_names_the_step() -> None:
    with pytest.raises(StepError, match="step 'tag'.s batch returned 1 results for 2"):
        StepChain(_recipe("ShortBatch")).run(_docs(["the a", "the b"]))


def test_record_steps_batch_only_when_a_step_can() -> None:
    assert RecordSteps(_recipe("PlainTagger")).batch_size == 1
    steps = RecordSteps(_recipe("BatchTagger"))
    assert steps.batch_size == BATCH_DOCS
    outcomes = steps.run(_docs(["the x", "no"]))
    assert steps.settle(outcomes[0]) == "THE X"
    steps.keep()
    assert steps.settle(outcomes[1]) is None
    taken = steps.take()
    assert taken is not None
    assert {k: v.to_pylist() if isinstance(v, pa.Array) else v for k, v in taken.items()
            if k.startswith(("tag.", "upper."))} == {"tag.count": [1], "upper.len": [5]}
