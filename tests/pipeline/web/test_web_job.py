"""Common Crawl-style inputs through the real job (real Dask LocalCluster): WARC and WET files
written from Debian's HTML manuals, with broken records; the web steps' counts reach the
summary and the manifest, metadata columns sit beside input_ids, the loader reads the tokens,
and another worker count gives the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import ReplicaSet, read_manifest, shards_of
from tests.pipeline.web import warcs


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("crawl")
    pages = warcs.debian_pages(24, min_bytes=3000)
    cp1252 = ("<html><body><p>Le caf\u00e9 est servi chaud avec une cr\u00e8me "
              "br\u00fbl\u00e9e. Nous avons visit\u00e9 la fa\u00e7ade de l'\u00e9glise "
              "pr\u00e8s du march\u00e9. Les \u00e9l\u00e8ves \u00e9tudient le "
              "fran\u00e7ais \u00e0 l'\u00e9cole depuis trois ans.</p></body></html>"
              ).encode("cp1252")
    warcs.write(d / "a.warc.gz", [warcs.warcinfo(),
                                  *(warcs.response(u, h) for u, h in pages[:12]),
                                  warcs.bad_header_member(),
                                  warcs.response("https://empty.example/", b"<html></html>"),
                                  warcs.response("https://fr.example/", cp1252,
                                                 "text/html; charset=cp1252")])
    # a copy of a page under another URL: exact dedup re-encodes b's shard, columns and all
    b = b"".join(warcs.response(u, h) for u, h in [(pages[0][0] + "?copy", pages[0][1]),
                                                      *pages[12:]])
    (d / "b.warc.gz").write_bytes(b[:-300])  # the last member is cut off
    warcs.write(d / "c.warc.wet.gz", [warcs.conversion(
        f"https://wet.example/{i}", f"Contact admin{i}@corp.com about server 8.8.{i}.1 today. "
        "The system was restored after the outage and all users can log in again. Our team "
        "worked through the night to replace the failed disks in the storage cluster, and "
        "the backups were checked twice before the service came back. We are sorry for the "
        "trouble this caused and will publish a full report next week.") for i in range(5)])
    return d


def _cfg(crawl: Path, out: Path, workers: int) -> PipelineConfig:
    return PipelineConfig(inputs=[str(crawl / "*.gz")], output=str(out), workers=workers,
                          dashboard_address="127.0.0.1:0", pii="mask",
                          filters="gopher_repetition")


def test_crawl_to_tokens(crawl: Path, tmp_path: Path) -> None:
    out = tmp_path / "one"
    summary = run(_cfg(crawl, out, 1), progress=False)
    assert summary.quarantined == {"malformed_record": 1, "truncated_input": 1}
    assert summary.dropped["extract_empty"] == 1
    assert summary.docs_in == 12 + 1 + 2 + 12 + 5 + 1  # pages, quarantined, others, WET
    assert summary.dropped["duplicate"] >= 1  # the copy; the WET texts once masked too
    m = read_manifest(str(out))
    assert m.stats["changed"]["extracted"] == 12 + 12 + 1
    assert m.stats["changed"]["pii_emails_masked"] >= 5  # the WET texts; manuals have some
    assert m.stats["changed"]["pii_ips_masked"] >= 5
    assert m.config["filters"] == "gopher_repetition" and m.config["web_inputs"] is True
    assert set(m.schema) == {"doc_id", "input_ids", "url", "date", "source", "lang",
                             "lang_score"}
    rows = []
    for shard in shards_of(str(out), m):
        rows += pq.read_table(out / shard.path, columns=["url", "source", "lang"]).to_pylist()
    assert len(rows) == m.stats["documents_out"] > 20
    assert not any(r["url"].endswith("?copy") for r in rows)
    # the whole path of each file (two crawl segments' files share base names)
    assert {r["source"].rsplit("@", 1)[0] for r in rows} == {
        str(crawl / "a.warc.gz"), str(crawl / "b.warc.gz"), str(crawl / "c.warc.wet.gz")}
    assert next(r for r in rows if r["url"] == "https://fr.example/")["lang"] == "fr"

    from pipeline.output.export import export  # the metadata columns travel with the tokens

    export(ReplicaSet.from_urls([str(out)]), str(tmp_path / "js"), "jsonl", progress=False)
    exported = [json.loads(line) for f in sorted((tmp_path / "js").glob("*.jsonl"))
                for line in f.read_text().splitlines()]
    assert [(r["url"], r["source"], r["lang"]) for r in exported] == [
        (r["url"], r["source"], r["lang"]) for r in rows]
    assert all(r["input_ids"] and r["lang_score"] > 0 for r in exported)
    quarantine = [json.loads(line) for q in m.quarantine
                  for line in (out / q.path).read_text().splitlines()]
    first = sorted((q["source"], q["reason"]) for q in quarantine)[0][0]
    assert first.startswith(f"{crawl}/a.warc.gz@")

    from loaders import TokenDataset

    seen = sum(int(s["input_ids"].numel()) for s in
               TokenDataset(str(out), 64, shuffle=False, rank=0, world_size=1))
    assert seen >= m.stats["tokens"] - 64 * len(rows)  # the loader reads the tokens

    again = tmp_path / "two"
    run(_cfg(crawl, again, 2), progress=False)
    assert (again / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    for shard in shards_of(str(out), m):
        assert (again / shard.path).read_bytes() == (out / shard.path).read_bytes()
