"""The lineage's pieces on their own: the drop records' bytes, the step hashes, the input
listing's hash, the code version, the manifest fields (and old manifests without them), and
the keepers dedup now hands phase 2."""

from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline.dedup import ENTRY, KIND_EXACT, resolve
from pipeline.dedup.components import leaf_centres, leaves
from pipeline.lineage import provenance, records
from pipeline.lineage.code_version import git_commit
from storage import Manifest
from storage.format.manifest import ObjectInfo

REPO = Path(__file__).resolve().parents[3]


def test_a_drop_record_is_deterministic_gzip_json_lines() -> None:
    lines = [records.step_line("a.txt:3", "clean", "clean.too_short"),
             records.dup_line("a.txt:9", "duplicate", 4, 0, 1)]
    data = records.encode(lines)
    assert data == records.encode(lines)  # no timestamp in the gzip header
    assert list(records.decode(data)) == lines
    assert gzip.decompress(data).decode().splitlines()[1] == \
        '{"k":[0,1],"p":4,"r":"duplicate","s":"a.txt:9"}'
    sha = "ab" * 32
    name = records.record_name(7, records.DUPS, sha)
    assert name == f"lineage/part-00007-dups-{sha[:16]}.jsonl.gz"
    assert records.partition_of(name) == 7 and records.kind_of(name) == "dups"


def test_config_sha256_is_the_entry_s_canonical_json_and_changes_with_an_option() -> None:
    entry = {"use": "clean", "name": "clean", "mode": "filter", "version": "1",
             "min_chars": 20}
    (step,) = provenance.step_records([entry])
    want = __import__("hashlib").sha256(json.dumps(entry, sort_keys=True, separators=(
        ",", ":")).encode()).hexdigest()
    assert step == {"name": "clean", "use": "clean", "version": "1", "mode": "filter",
                    "options": {"min_chars": 20}, "config_sha256": want}
    other = provenance.step_records([{**entry, "min_chars": 21}])[0]["config_sha256"]
    assert other != want


def test_the_listing_hash_covers_url_size_and_version() -> None:
    a = [("s3://b/x.jsonl", 10, "v1"), ("s3://b/y.jsonl", 20, "v1")]
    n, sha = provenance.listing_sha256(a)
    assert n == 2
    assert sha == __import__("hashlib").sha256(
        b"s3://b/x.jsonl\t10\tv1\ns3://b/y.jsonl\t20\tv1\n").hexdigest()
    assert provenance.listing_sha256([a[0], ("s3://b/y.jsonl", 20, "v2")])[1] != sha


def test_the_git_commit_is_the_checkout_s_head(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert git_commit(REPO) == head
    assert git_commit(tmp_path) is None  # not a checkout: no commit, not a guess


def _manifest_dict() -> dict:
    return {"format": "shardflow.dataset/2", "schema": {"doc_id": "string"},
            "tokenizer": {"name": "t", "path": "tokenizer.json", "sha256": "0" * 64,
                          "vocab_size": 10, "eos_id": None, "eos_token": None},
            "index": {"path": "index/" + "1" * 16 + ".sfidx", "bytes": 5,
                      "sha256": "1" * 64, "header_sha256": "2" * 64},
            "totals": {"shards": 1, "row_groups": 1, "rows": 1, "tokens": 1, "bytes": 1},
            "config": {}, "stats": {}, "quarantine": []}


# mtime=0 and ids: gzip's header holds the time, and parameters must be the same in every
# xdist worker's collection (two collecting a second apart made the run an error)
@pytest.mark.parametrize("data", [b"not gzip", gzip.compress(b"{}\nnot json\n", mtime=0),
                                  gzip.compress(b"\xff\xfe", mtime=0)],
                         ids=["not gzip", "not json", "not utf-8"])
def test_a_hostile_drop_record_is_one_error_naming_it(data: bytes) -> None:
    with pytest.raises(ValueError, match="lineage/part-00001-steps-x"):
        list(records.decode(data, "lineage/part-00001-steps-x"))


def test_a_drop_record_that_decompresses_past_the_bound_is_refused(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 1000)
    bomb = gzip.compress(b"\n" * 10_000)  # ~50 bytes that would be 10 KB
    with pytest.raises(ValueError, match="more than 1,000 bytes"):
        list(records.decode(bomb, "r"))


def test_a_manifest_without_lineage_loads_and_keeps_its_bytes() -> None:
    old = json.dumps(_manifest_dict(), sort_keys=True, indent=1) + "\n"
    m = Manifest.from_json(old)
    assert m.lineage == {} and m.drops is None
    again = m.to_json()
    assert "lineage" not in json.loads(again) and "drops" not in json.loads(again)
    assert Manifest.from_json(again).to_json() == again


def test_a_manifest_s_lineage_and_drop_records_round_trip_and_are_its_objects(
        tmp_path: Path) -> None:
    """The manifest names one list of the drop records (a million partitions' records would
    make it tens of MB); the records are the version's objects through that list."""
    from storage import ReplicaSet, objects_of
    from storage.format.layout import drops_list_name
    from storage.io.index_store import drop_records_of, write_object_list

    records = [ObjectInfo(f"lineage/part-{i:05d}-dups-" + f"{i:016x}" + ".jsonl.gz", 9 + i,
                          f"{i:064x}") for i in range(3)]
    store = ReplicaSet.from_urls([str(tmp_path)])
    listed = write_object_list(store, records, drops_list_name)
    assert listed is not None and listed.path.startswith("lineage/drops-")
    assert write_object_list(store, [], drops_list_name) is None
    d = _manifest_dict() | {"lineage": {"source": "doc_id", "steps": []},
                            "drops": {"path": listed.path, "bytes": listed.bytes,
                                      "sha256": listed.sha256}}
    m = Manifest.from_json(json.dumps(d))
    assert m.drops == listed and m.lineage["source"] == "doc_id"
    assert (listed.path, listed.bytes, listed.sha256) in m.objects()
    assert drop_records_of(store, m) == tuple(records)
    everything = objects_of(store, dataclasses.replace(m, index=None, totals=None,
                                                        format="shardflow.dataset/1"))
    assert all((r.path, r.bytes, r.sha256) in everything for r in records)
    assert json.loads(m.to_json())["drops"] == d["drops"]
    (tmp_path / listed.path).write_bytes(b"{}\n")  # damaged: a verified read refuses it
    with pytest.raises(Exception, match="sha256|checksum|Checksum"):
        drop_records_of(store, m)


def test_resolve_names_the_document_each_duplicate_duplicates() -> None:
    e = np.zeros(5, dtype=ENTRY)
    # key 7 in (0, 3), (1, 0), (2, 5); key 9 in (0, 1), (0, 4)
    for i, (k, part, pos) in enumerate([(7, 1, 0), (9, 0, 4), (7, 0, 3), (9, 0, 1),
                                        (7, 2, 5)]):
        e[i]["k0"], e[i]["part"], e[i]["pos"], e[i]["kind"] = k, part, pos, KIND_EXACT
    got = {(int(d["part"]), int(d["pos"])): (int(d["keep_part"]), int(d["keep_pos"]))
           for d in resolve(e)}
    assert got == {(0, 4): (0, 1), (1, 0): (0, 3), (2, 5): (0, 3)}


def test_a_near_duplicate_s_keeper_is_its_star_s_centre() -> None:
    from pipeline.dedup.components import EDGE

    records_ = np.array([(5, 2), (2, 5), (9, 2), (2, 9), (12, 11), (11, 12)], dtype=EDGE)
    node, centre = leaf_centres(records_)
    assert node.tolist() == leaves(records_).tolist() == [5, 9, 12]
    assert centre.tolist() == [2, 2, 11]


def test_the_step_and_reason_of_a_drop_are_known_in_the_worker_and_in_isolation() -> None:
    """Phase 1 records ``(step, reason)`` for each dropped document whichever way its
    record ran (in the worker, or in the isolation process after a lost attempt)."""
    from pipeline.cleaning import CleaningConfig
    from pipeline.records import Document
    from pipeline.steps.shorthand import recipe_of
    from pipeline.tasks.isolation import IsolatedSteps
    from pipeline.tasks.record_steps import RecordLimits, RecordSteps

    recipe = recipe_of(CleaningConfig(min_chars=20))
    isolated = IsolatedSteps(recipe, None, RecordLimits())
    try:
        for steps in (RecordSteps(recipe), isolated):
            assert steps(Document("a", "short")) is None
            assert steps.last_drop == ("clean", "too_short")
            assert steps(Document("b", "A sentence long enough to be kept.")) is not None
    finally:
        isolated.close()


@pytest.mark.parametrize("order", ["abc", [[1]], [0, 0], [0, 2], [-1, 0], [0.0, 1], [True, 0],
                                   {"0": 1}, None])
def test_a_crafted_order_line_is_one_error_naming_the_record(order: object) -> None:
    lines = [{"s": "a.txt:1", "r": "duplicate", "p": 0, "k": [1, 0]}, {"order": order}]
    if order is None:  # no such line: phase 1's order
        assert records.order_of(lines[:1], "lineage/x") is None
        return
    with pytest.raises(ValueError, match="lineage/x: its order line"):
        records.order_of(lines, "lineage/x")


def test_an_order_line_is_read_back() -> None:
    lines = [records.order_line(np.array([2, 0, 1]))]
    assert records.order_of(lines, "x") == [2, 0, 1]
