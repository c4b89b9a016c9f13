"""The dataset card's pure parts: which stage counts a reason, the documents' way through the
stages, the decontamination report read leniently, lengths and languages, and Markdown that
a crafted manifest cannot break out of."""

from __future__ import annotations

import numpy as np

from pipeline.output import card_figures as cf
from pipeline.output.card_markdown import cell, code, render

STEPS = [{"name": "extract", "use": "extract", "version": "1", "mode": "filter"},
         {"name": "clean", "use": "clean", "version": "1", "mode": "filter"},
         {"name": "langid", "use": "langid", "version": "1", "mode": "filter"},
         {"name": "gopher_quality", "use": "gopher_quality", "version": "1", "mode": "filter"},
         {"name": "dclm", "use": "fasttext", "version": "2", "mode": "filter"}]


def test_each_reason_goes_to_the_stage_that_counts_it() -> None:
    assert cf.stage_of("too_short", STEPS) == "clean"
    assert cf.stage_of("extract_empty", STEPS) == "extract"
    assert cf.stage_of("language", STEPS) == "langid"
    assert cf.stage_of("gopher_quality.short_doc", STEPS) == "gopher_quality"
    assert cf.stage_of("dclm", STEPS) == cf.stage_of("dclm.error", STEPS) == "dclm"
    assert cf.stage_of("duplicate", STEPS) == cf.stage_of("near_duplicate", STEPS) == "dedup"
    assert cf.stage_of("decontaminate.mmlu", STEPS) == "decontaminate"
    assert cf.stage_of("url_blocked", []) == "url_blocklist"  # a run from before recipes
    assert cf.stage_of("mystery", STEPS) == "other"
    assert cf.stage_of("tool.reason", STEPS) == "tool"


def test_the_flow_takes_each_stage_from_what_reached_it() -> None:
    stats = {"documents_in": 100, "documents_out": 61, "tokens": 5000,
             "dropped": {"too_short": 5, "language": 10, "gopher_quality.short_doc": 7,
                         "duplicate": 4, "near_duplicate": 3, "decontaminate.mmlu": 2},
             "quarantined": {"malformed_record": 2, "dclm.error": 1, "record_cpu_limit": 5}}
    flow = cf.flow(stats, STEPS, "exact")
    rows = {s.name: (s.docs_in, s.dropped, s.quarantined, s.docs_out) for s in flow.stages}
    assert [s.name for s in flow.stages] == ["read", "extract", "clean", "langid",
                                             "gopher_quality", "dclm", "decontaminate",
                                             "dedup"]
    assert rows["read"] == (100, 0, 7, 93)  # the reader's and the record limits' quarantines
    assert rows["clean"] == (93, 5, 0, 88)
    assert rows["dclm"] == (71, 0, 1, 70)
    assert rows["dedup"] == (68, 7, 0, 61)
    assert flow.gap == 0
    assert cf.flow({**stats, "documents_out": 60}, STEPS, "exact").gap == -1


def test_the_report_is_read_leniently_and_the_manifest_counts_come_first() -> None:
    stats = {"dropped": {"decontaminate.mmlu": 3, "duplicate": 9}}
    assert cf.contamination({}, None) is None
    sets = cf.contamination(stats, {"sets": {"mmlu": {
        "documents": 3, "ngrams": 17,
        "examples": [{"doc_id": "a.jsonl:4", "ngrams": ["the quick brown fox"]}, "x", "y",
                     "z"]}, "gsm8k": {"documents_hit": [1, 2]}}})
    assert sets is not None
    by_name = {e.name: e for e in sets}
    assert by_name["mmlu"].dropped == 3 and by_name["mmlu"].ngrams == 17
    assert by_name["mmlu"].examples == ("a.jsonl:4: the quick brown fox", "x", "y")
    assert by_name["gsm8k"].dropped is None and by_name["gsm8k"].documents == 2
    assert cf.contamination(stats, "not a dict")[0].name == "mmlu"  # type: ignore[index]
    assert cf.contamination({}, [{"name": "arc", "hits": 5}])[0].documents == 5  # type: ignore[index]
    # the decontaminate step's own shapes: stats.contamination.documents by <step>.<set>,
    # contamination.json by set (or by step, then set), examples with id and ngrams
    step = cf.contamination(
        {"contamination": {"documents": {"decontaminate.mmlu": 4}},
         "dropped": {"decontaminate.mmlu": 4}},
        {"decontaminate": {"mmlu": {"documents": 4, "examples": [
            {"id": "d.jsonl:7", "source": "d.jsonl:7", "ngrams": ["a b c", "b c d"]}]}}})
    assert step == (cf.EvalSet("mmlu", 4, 4, None, ("d.jsonl:7: a b c | b c d",)),)
    flagged = cf.contamination({"contamination": {"documents": {"decon.arc": 2}}}, None)
    assert flagged == (cf.EvalSet("arc", None, 2),)


def test_lengths_and_languages() -> None:
    le = cf.lengths(np.array([1, 2, 2, 3, 100]))
    assert (le.minimum, le.maximum, le.documents) == (1, 100, 5)
    assert dict(le.percentiles)[50] == 2.0 and le.mean == 21.6
    assert sum(le.counts) == 5 and le.edges[0] == 1 and le.edges[-1] >= 101
    assert all(float(e).is_integer() for e in le.edges)
    langs = cf.languages(["en", None, "de", "en"], [10, 1, 5, 3])
    assert langs == (("en", 2, 13), ("(none)", 1, 1), ("de", 1, 5))
    many = cf.languages([f"l{i:02d}" for i in range(30)])
    assert len(many) == cf.TOP_LANGUAGES + 1 and many[-1] == ("(other)", 10, 0)


def test_markdown_from_a_crafted_manifest_stays_in_its_cells() -> None:
    hostile = "x | <script>alert(1)</script> ![img](http://e/) `code`\n# heading"
    assert "|" not in cell(hostile).replace("\\|", "")
    assert "<" not in cell(hostile) and "\n" not in cell(hostile) and "`" not in cell(hostile)
    assert "](" not in cell(hostile).replace("\\](", "")
    assert "\n" not in code(hostile) and "`" not in code(hostile)
    flow = cf.flow({"documents_in": 2, "documents_out": 1, "tokens": 3,
                    "dropped": {hostile: 1}}, [], "exact")
    f = cf.Figures(
        title=hostile, version="0" * 64, format="shardflow.dataset/2", documents=1, tokens=3,
        bytes=10, shards=1, row_groups=1,
        tokenizer={"name": hostile, "vocab_size": 10, "eos_id": 0, "eos_token": hostile},
        flow=flow, dropped=cf.reasons_table({hostile: 1}, []), quarantined=(), changed=(),
        sampled=1, languages=((hostile, 1, 3),), lengths=cf.lengths([3]), clusters=None,
        exact_counts=None, signals=(), decontamination=None, recipe=({"use": hostile},),
        config={})
    text = render(f, [], "data/x`\nrm -rf /")
    import re

    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # code is shown as it is, inert
    prose = re.sub(r"`[^`\n]*`", "", prose)
    assert "<script>" not in prose and "\n# heading" not in text and "![img]" not in prose
    assert not any(line.startswith("rm") for line in text.splitlines())
    assert "'data/x'\\'' rm -rf /'" in text  # one quoted shell word
    for line in text.splitlines():
        if line.startswith("|"):  # every table row keeps its column count
            assert line.replace("\\|", "").count("|") in (3, 5, 6, 7), line


def test_pictures_can_be_turned_off_by_the_environment(monkeypatch) -> None:  # noqa: ANN001
    from pipeline.output import card_plots

    monkeypatch.setenv(card_plots.ENV_PLOTS, "0")
    assert card_plots.available() == f"pictures turned off ({card_plots.ENV_PLOTS}=0)."
    monkeypatch.setenv(card_plots.ENV_PLOTS, "1")
    assert card_plots.available() is None  # matplotlib is installed here (the dev extra)
