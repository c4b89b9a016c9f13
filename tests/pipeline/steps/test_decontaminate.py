"""The ``decontaminate`` step: eval sets from JSONL, Parquet and text files, planted passages
found (whole and partial, with changed case and punctuation), unrelated text never flagged,
annotate mode's signals, bad eval files as one error naming the file, the flags as the
default recipe with the files' content pinned, and a real run's drops, signals and report
(``contamination/<sha16>.json``, one per version)."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import PipelineConfig
from pipeline.planning.discovery import default_corpus
from pipeline.steps.contract import Doc
from pipeline.steps.decontaminate import Decontaminate, load_index

#: eval examples: sentences no play of Shakespeare's holds
EVAL = [
    "The mitochondria is the membrane bound organelle that generates most of the chemical "
    "energy needed to power the biochemical reactions of the cell.",
    "A binary search tree keeps its keys in sorted order so that lookup insertion and "
    "deletion take time proportional to the logarithm of the number of items stored.",
    "Photosynthesis converts light energy into chemical energy stored in glucose using carbon "
    "dioxide and water while releasing oxygen into the atmosphere as a by product.",
    "The French Revolution began in 1789 with the storming of the Bastille and ended the "
    "absolute monarchy that had ruled France for centuries before it.",
]
QUESTIONS = ["What is the capital city of Australia and why was it chosen over Sydney and "
             "Melbourne when the federation was formed in the year 1901?"]


def _write_sets(root: Path) -> list[str]:
    (root / "science.jsonl").write_text(
        "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(EVAL[:2])))
    pq.write_table(pa.table({"text": EVAL[2:]}), root / "history.parquet")
    (root / "quiz.txt").write_text("\n".join(QUESTIONS) + "\n\n")
    return [str(root / "science.jsonl"), str(root / "history.parquet"), str(root / "quiz.txt")]


def _mangle(text: str, rnd: random.Random) -> str:
    """Other case, punctuation and spacing: the same words to the step."""
    out = []
    for w in text.split():
        w = w.strip(".,?")
        w = w.upper() if rnd.random() < 0.3 else w.capitalize() if rnd.random() < 0.3 else w
        out.append(w + rnd.choice([" ", ", ", "; ", " -- ", "!\n", "  ", "... "]))
    return "".join(out)


def _shakespeare(k: int | None = None) -> list[str]:
    """Paragraphs of 20 words or more of the demo corpus's plays (``k``: of the first few)."""
    paths = sorted(glob.glob(default_corpus()[0]))
    text = "\n".join(Path(p).read_text(encoding="utf-8", errors="replace")
                     for p in (paths[:4] if k else paths))
    paras = [p for p in re.split(r"\n\s*\n", text) if len(p.split()) >= 20]
    return paras[:k] if k else paras


def test_planted_passages_are_found_and_unrelated_text_never(tmp_path: Path) -> None:
    step = Decontaminate(_write_sets(tmp_path))
    rnd = random.Random(7)
    corpus = _shakespeare(400)
    assert len(corpus) == 400
    planted: dict[int, str] = {}
    for i, text in enumerate(EVAL + QUESTIONS):
        for j, how in enumerate(("whole", "partial")):
            words = text.split()
            piece = " ".join(words if how == "whole" else words[3:3 + 14])
            at = 35 * (2 * i + j) + 3
            corpus[at] = corpus[at] + " " + _mangle(piece, rnd) + " " + corpus[at + 1]
            planted[at] = ["science", "science", "history", "history", "quiz"][i]
    results = [step(Doc(f"doc:{k}", t)) for k, t in enumerate(corpus)]
    dropped = {k: r[1] for k, r in enumerate(results) if isinstance(r, tuple)}
    assert dropped == planted  # recall 1.0, each to its set, and no false positive
    report = step.report()
    assert {k: v["documents"] for k, v in report.items()} == {"history": 4, "quiz": 2,
                                                              "science": 4}
    first = report["science"]["examples"][0]
    assert first["id"] == "doc:3" and first["source"] == "doc:3"
    assert "the mitochondria is the membrane bound organelle that generates most of the" in \
        first["ngrams"][0]


def test_annotate_mode_keeps_every_document_and_writes_signals(tmp_path: Path) -> None:
    step = Decontaminate(_write_sets(tmp_path), min_overlap=0.5, mode="annotate")
    half = " ".join(EVAL[0].split()[:14])  # 2 of its 11 n-grams
    docs = [Doc("a", "Nothing to see."), Doc("b", EVAL[0].upper()), Doc("c", half)]
    assert [step(d) for d in docs] == docs
    assert [d.signals for d in docs] == [
        {"hits": 0, "overlap": 0.0, "set": ""},
        {"hits": 11, "overlap": 1.0, "set": "science"},
        {"hits": 2, "overlap": pytest.approx(2 / 11), "set": ""}]
    assert step.report()["science"]["documents"] == 1


def test_eval_files_as_sets_named_by_stem(tmp_path: Path) -> None:
    loaded = load_index(_write_sets(tmp_path), 13)
    assert loaded.index.set_names == ["history", "quiz", "science"]
    assert [loaded.index.examples_of(s) for s in loaded.index.set_names] == [2, 1, 2]
    again = load_index([str(tmp_path / "*.*")], 13)
    assert again.sha256 == loaded.sha256  # the same files through a glob
    (tmp_path / "quiz.txt").write_text(QUESTIONS[0] + " changed\n")
    assert load_index([str(tmp_path / "*.*")], 13).sha256 != loaded.sha256


@pytest.mark.parametrize(("name", "content", "message"), [
    ("missing.jsonl", None, r"missing\.jsonl: cannot read \(No such file"),
    ("fifo.jsonl", "FIFO", r"fifo\.jsonl: is a FIFO \(named pipe\), not a regular file"),
    ("empty.jsonl", "", r"empty\.jsonl: is empty"),
    ("bad.jsonl", '{"text": "fine"}\n{"text": broken\n', r"bad\.jsonl, line 2: not JSON"),
    ("nofield.jsonl", '{"body": "x"}\n', r"nofield\.jsonl, line 1: no 'text' string field"),
    ("bad.parquet", "not parquet", r"bad\.parquet: not a Parquet file with a 'text' column"),
])
def test_a_bad_eval_file_is_one_error_naming_it(tmp_path: Path, name: str, content: str | None,
                                                message: str) -> None:
    path = tmp_path / name
    if content == "FIFO":
        os.mkfifo(path)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=r"step 'decontaminate' \(decontaminate\): "
                       r"decontaminate eval .*" + message):
        PipelineConfig(decontaminate=str(path))


def test_bad_options_and_globs(tmp_path: Path) -> None:
    files = _write_sets(tmp_path)
    with pytest.raises(ValueError, match="no file matches"):
        PipelineConfig(decontaminate=str(tmp_path / "nothing*.jsonl"))
    with pytest.raises(ValueError, match="min_overlap must be a fraction"):
        PipelineConfig(decontaminate=files[0], decontaminate_min_overlap=1.5)
    with pytest.raises(ValueError, match="mode must be 'filter' or 'annotate'"):
        PipelineConfig(decontaminate=files[0], decontaminate_mode="drop")
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "science.txt").write_text(EVAL[0] + "\n")
    with pytest.raises(ValueError, match="a second set named 'science'"):
        PipelineConfig(decontaminate=f"{files[0]},{tmp_path / 'more' / 'science.txt'}")
    with pytest.raises(ValueError, match="--decontaminate.*give every step's options in the"):
        PipelineConfig(decontaminate=files[0], steps='[{"use": "clean"}]')


def test_the_flags_are_the_default_recipe_with_the_content_pinned(tmp_path: Path) -> None:
    files = _write_sets(tmp_path)
    cfg = PipelineConfig(decontaminate=",".join(files), decontaminate_mode="annotate",
                         filters="c4")
    entries = cfg.for_manifest()["steps"]
    assert [e["use"] for e in entries] == ["extract", "clean", "c4", "decontaminate"]
    entry = entries[-1]
    assert entry["mode"] == "annotate" and entry["n"] == 13 and entry["eval"] == files
    assert entry["eval_sha256"] == load_index(files, 13).sha256 and entry["version"] == "1"
    recipe = json.dumps([{"use": "decontaminate", "eval": files, "min_overlap": 0.2}])
    from_recipe = PipelineConfig(steps=recipe).for_manifest()["steps"][0]
    assert from_recipe["eval_sha256"] == entry["eval_sha256"]
    stale = json.dumps([{"use": "decontaminate", "eval": files, "eval_sha256": "0" * 64}])
    with pytest.raises(ValueError, match="eval_sha256 0000000000000000... is not the eval"):
        PipelineConfig(steps=stale)
    assert "decontaminate" not in json.dumps(PipelineConfig().for_manifest())


def test_the_step_is_listed_by_pipeline_steps() -> None:
    from pipeline.steps.catalog import describe, render

    entry = next(e for e in describe() if e["name"] == "decontaminate")
    assert entry["modes"] == ["filter", "annotate"] and entry["options"]["eval"] == "required"
    assert entry["options"]["n"] == "13"
    assert entry["signals"] == {"hits": "int64", "overlap": "double", "set": "string"}
    assert "decontaminate.hits (int64)" in render(describe())


def test_no_false_positive_on_the_whole_demo_corpus(tmp_path: Path) -> None:
    """Every paragraph of every play against eval sets of unrelated text: not one shared
    n-gram."""
    corpus = _shakespeare()
    assert len(corpus) > 5000
    step = Decontaminate(_write_sets(tmp_path), mode="annotate")
    assert sum(step(Doc(str(i), t)).signals["hits"] for i, t in enumerate(corpus)) == 0


def _corpus(root: Path) -> tuple[list[str], dict[str, str]]:
    """Two JSONL inputs of Shakespeare paragraphs, six with planted eval passages (whole and
    partial, mangled): id -> the set each must be found in."""
    rnd = random.Random(3)
    paras = _shakespeare(160)
    planted: dict[str, str] = {}
    sets = ["science", "science", "history", "history", "quiz"]
    for i, text in enumerate(EVAL + QUESTIONS):
        at = 30 * i + 5
        piece = text if i % 2 == 0 else " ".join(text.split()[2:2 + 15])
        paras[at] = paras[at] + "\n" + _mangle(piece, rnd)
        planted[f"d{at}"] = sets[i]
    lines = [json.dumps({"text": t, "id": f"d{k}"}) for k, t in enumerate(paras)]
    (root / "a.jsonl").write_text("\n".join(lines[:80]) + "\n")
    (root / "b.jsonl").write_text("\n".join(lines[80:]) + "\n")
    return [str(root / "a.jsonl"), str(root / "b.jsonl")], planted


def _build(root: Path, inputs: list[str], out: str, **flags: object) -> dict:
    from pipeline.driver.job import run

    summary = run(PipelineConfig(inputs=inputs, output=str(root / out), workers=1,
                                 id_field="id", files_per_partition=1,
                                 dashboard_address="127.0.0.1:0", card=False, **flags),
                  progress=False)
    assert summary.docs_in == 160, summary.render()
    manifest = json.loads((root / out / "manifest.json").read_text())
    assert summary.contamination == manifest["stats"]["contamination"]["documents"]
    assert "contaminated decontaminate." in summary.render()  # the summary names the counts
    return manifest


def test_a_run_drops_counts_and_reports_planted_passages(tmp_path: Path) -> None:
    sets = _write_sets(tmp_path)
    inputs, planted = _corpus(tmp_path)
    manifest = _build(tmp_path, inputs, "ds", decontaminate=",".join(sets))
    stats = manifest["stats"]
    assert {k: v for k, v in stats["dropped"].items() if k.startswith("decontaminate.")} == \
        {"decontaminate.science": 2, "decontaminate.history": 2, "decontaminate.quiz": 1}
    assert stats["documents_out"] == 160 - 5
    data = (tmp_path / "ds" / stats["contamination"]["report"]).read_bytes()
    assert data == (tmp_path / "ds" / "contamination.json").read_bytes()  # the root's copy
    report = json.loads(data)
    assert stats["contamination"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["reports"] == [{"path": stats["contamination"]["report"],
                                    "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    assert stats["contamination"]["documents"] == {
        "decontaminate.history": 2, "decontaminate.quiz": 1, "decontaminate.science": 2}
    step = report["steps"]["decontaminate"]
    assert step["n"] == 13 and step["mode"] == "filter" and len(step["eval_sha256"]) == 64
    found = {e["id"]: name for name, s in step["sets"].items() for e in s["examples"]}
    assert found == planted  # each planted document named, in its set, and nothing else
    # each record's source, file:line (its --id-field id is the record's own, not where it is)
    for e in (e for s in step["sets"].values() for e in s["examples"]):
        k = int(e["id"][1:])
        assert e["source"] == (f"a.jsonl:{k + 1}" if k < 80 else f"b.jsonl:{k - 79}")
    assert step["sets"]["quiz"]["eval_examples"] == 1
    assert all(len(g.split()) == 13 for s in step["sets"].values() for e in s["examples"]
               for g in e["ngrams"])
    assert "decontaminate" in {s["use"] for s in manifest["config"]["steps"]}


def test_each_version_keeps_its_own_report_which_gc_and_verify_treat_as_its_object(
        tmp_path: Path) -> None:
    """A rerun with another eval set is a new version with another report; the old version's
    report stays while that version is kept, gc removes it after, verify checks the kept one."""
    from storage import ReplicaSet
    from storage.admin.gc import collect
    from storage.admin.scrub import verify

    sets = _write_sets(tmp_path)
    inputs, _ = _corpus(tmp_path)
    first = _build(tmp_path, inputs, "ds", decontaminate=",".join(sets))
    second = _build(tmp_path, inputs, "ds", decontaminate=sets[0])  # science only
    old, new = (m["stats"]["contamination"]["report"] for m in (first, second))
    ds = tmp_path / "ds"
    assert old != new and (ds / old).is_file() and (ds / new).is_file()
    assert json.loads((ds / old).read_text())["steps"]["decontaminate"]["sets"].keys() == {
        "science", "history", "quiz"}
    assert (ds / "contamination.json").read_bytes() == (ds / new).read_bytes()
    store = ReplicaSet.from_urls([str(ds)])
    collect(store, keep=2, min_age_s=0)
    assert (ds / old).is_file()  # its version is kept
    collect(store, keep=1, min_age_s=0)
    assert not (ds / old).exists() and (ds / new).is_file()
    assert verify(store).ok
    (ds / new).write_text("{}")  # damaged: verify names it
    report = verify(store)
    assert not report.ok and new in report.render()


def test_a_run_in_annotate_mode_keeps_all_and_writes_signals(tmp_path: Path) -> None:
    sets = _write_sets(tmp_path)
    inputs, planted = _corpus(tmp_path)
    manifest = _build(tmp_path, inputs, "ds", decontaminate=",".join(sets),
                      decontaminate_mode="annotate")
    stats = manifest["stats"]
    assert stats["documents_out"] == 160 and not any(
        k.startswith("decontaminate") for k in stats["dropped"])
    assert stats["signals"] == {
        "decontaminate.hits": {"type": "int64", "step": "decontaminate"},
        "decontaminate.overlap": {"type": "double", "step": "decontaminate"},
        "decontaminate.set": {"type": "string", "step": "decontaminate"}}
    rows = [r for p in sorted((tmp_path / "ds" / "shards").iterdir())
            for r in pq.read_table(p, columns=["decontaminate.hits",
                                               "decontaminate.set"]).to_pylist()]
    flagged = [r["decontaminate.set"] for r in rows if r["decontaminate.set"]]
    assert sorted(flagged) == sorted(planted.values())
    assert sum(1 for r in rows if r["decontaminate.hits"]) == len(planted)
    assert stats["contamination"]["documents"]["decontaminate.quiz"] == 1


def test_reports_merge_in_partition_order_whatever_the_arrival() -> None:
    from pipeline.tasks.work import StepReports

    def part(i: int, k: int) -> dict:
        return {"decontaminate": {"s": {"documents": k, "examples": [
            {"id": f"p{i}-{j}"} for j in range(k)]}}}

    orders = [list(range(30)), list(reversed(range(30))), [7, 3, 29, 0, 15, *range(30)]]
    merged = []
    for order in orders:
        reports = StepReports()
        for i in dict.fromkeys(order):
            reports.add(i, part(i, 7))
        merged.append(reports.merged())
        assert sum(len(kept) for _, kept in reports.parts[("decontaminate", "s")]) <= 105
    assert merged[0] == merged[1] == merged[2]
    s = merged[0]["decontaminate"]["s"]
    assert s["documents"] == 210 and len(s["examples"]) == 100
    assert s["examples"][0] == {"id": "p0-0"} and s["examples"][-1] == {"id": "p14-1"}


def test_a_changed_eval_file_changes_the_partition_salt(tmp_path: Path) -> None:
    files = _write_sets(tmp_path)
    before = json.dumps(PipelineConfig(decontaminate=files[2]).for_manifest(), sort_keys=True)
    assert before == json.dumps(PipelineConfig(decontaminate=files[2]).for_manifest(),
                                sort_keys=True)
    Path(files[2]).write_text(QUESTIONS[0] + " and one more example line here\n")
    after = json.dumps(PipelineConfig(decontaminate=files[2]).for_manifest(), sort_keys=True)
    assert after != before


def test_isolation_keeps_the_reports_of_children_that_ended(tmp_path: Path) -> None:
    """A task lost with its worker runs its records in a child process: the reports come
    back from it, and those of a child that ended (a poison record) are kept."""
    from pipeline.records import Document
    from pipeline.steps.recipe import Recipe
    from pipeline.tasks.isolation import IsolatedSteps
    from pipeline.tasks.record_steps import Poisoned, RecordLimits, RecordSteps

    recipe = PipelineConfig(decontaminate=",".join(_write_sets(tmp_path))).recipe
    assert isinstance(recipe, Recipe)
    docs = [Document(f"d{i}", t) for i, t in enumerate(
        [EVAL[0], "Nothing here at all.", QUESTIONS[0].lower(), EVAL[2]])]
    here = RecordSteps(recipe)
    assert [here(d) for d in docs] == [None, "Nothing here at all.", None, None]
    isolated = IsolatedSteps(recipe, None, RecordLimits())
    try:
        assert isolated(docs[0]) is None
        isolated._child.proc.kill()  # type: ignore[union-attr]
        isolated._child.proc.wait()  # type: ignore[union-attr]
        with pytest.raises(Poisoned):
            isolated(docs[1])
        assert [isolated(d) for d in docs[2:]] == [None, None]
    finally:
        isolated.close()
    assert isolated.reports() == here.reports()
    assert {k: v["documents"] for k, v in here.reports()["decontaminate"].items()} == \
        {"science": 1, "quiz": 1, "history": 1}


def test_a_partitions_report_survives_its_marker_and_a_rerun_reuses_it() -> None:
    """A killed run's rerun reuses finished partitions from their markers: their reports
    come back with their counts; a partition without one keeps the marker it always had."""
    from pipeline.tasks.work import PhaseOne, PhaseOneResults, PhaseOneState, counts_only, marker

    report = {"decontaminate": {"s": {"documents": 1, "examples": [{"id": "d1"}]}}}
    hit, clean = PhaseOne(0, "k0", docs_in=3, reports=report), PhaseOne(1, "k1", docs_in=2)
    assert "reports" not in marker(clean) and marker(hit)["reports"] == report
    state = PhaseOneState(2)
    for one in (hit, clean):
        state.put(one.index, counts_only(json.loads(json.dumps(marker(one)))))
    ones = PhaseOneResults(2)
    for i in (1, 0):
        ones.add(state.get(i))  # type: ignore[arg-type]
    assert ones.reports.merged() == report
    state.put(0, None)  # the marker turned out unusable: redone, its report with it
    assert state.get(0) is None and not state.reports



def test_a_worker_reading_other_eval_bytes_refuses_to_run(tmp_path: Path) -> None:
    from pipeline.steps.contract import StepError
    from pipeline.steps.registry import build

    files = _write_sets(tmp_path)
    spec = PipelineConfig(decontaminate=files[0]).recipe.steps[-1]
    assert build(spec).loaded.sha256 == dict(spec.options)["eval_sha256"]
    Path(files[0]).write_text(json.dumps({"text": EVAL[1]}) + "\n")  # changed since the pin
    with pytest.raises(StepError, match=r"science\.jsonl: their content .* is not the run's"):
        build(spec)
