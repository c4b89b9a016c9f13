"""``python -m pipeline run`` over the published WARC test files (tests/pipeline/readers/data)
with the README's Common Crawl flags: ``--url-blocklist`` crashed every run (an options dict
given to a cache), wget's bracketed URL could never be blocked, and the tokens held chunk
sizes and compressed bytes. Read back through the tokenizer, the shards now hold the pages'
text."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.readers import ReadOptions, warc
from pipeline.records import Document
from storage import ReplicaSet, read_manifest

DATA = Path(__file__).parents[1] / "readers" / "data"
FILES = ["dolma/sample-0000.warc.gz", "dolma/sample-0001.warc.gz",
         "warcio/example-iana.org-chunked.warc", "warcio/example.warc.gz",
         "warcio/example-wget-bad-target-uri.warc.gz"]


def html_pages() -> list[Document]:
    out = []
    for name in FILES:
        with open(DATA / name, "rb") as fh:
            out += [d for d in warc.read(fh, name, ReadOptions(), [0])
                    if isinstance(d, Document) and d.kind == "html"]
    return out


@pytest.mark.slow
def test_blocklist_and_decoded_bodies_through_pipeline_run(tmp_path: Path) -> None:
    crawl = tmp_path / "crawl"
    for name in FILES:  # two folders, as a crawl's segments
        (crawl / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / name, crawl / name)
    blocklist = tmp_path / "blocklist.txt"
    blocklist.write_text("# a domain and a whole URL\ncreativecommons.org\n"
                         "http://example.com/\n")
    pages = html_pages()
    blocked = [d for d in pages if "creativecommons.org" in d.url
               or d.url == "http://example.com/"]
    assert len(blocked) == 4 + 2  # wget's <http://example.com/> among them

    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(crawl / "dolma" / "*.warc.gz"),
         str(crawl / "warcio" / "*.warc*"), "--output", str(out), "--workers", "2",
         "--url-blocklist", str(blocklist), "--no-progress",
         "--dashboard-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    m = read_manifest(str(out))
    assert m.stats["dropped"]["url_blocked"] == len(blocked)

    from pipeline.output.export import export

    export(ReplicaSet.from_urls([str(out)]), str(tmp_path / "js"), "jsonl", progress=False)
    rows = [json.loads(line) for f in sorted((tmp_path / "js").glob("*.jsonl"))
            for line in f.read_text().splitlines()]
    assert len(rows) == m.stats["documents_out"]
    urls = {r["url"] for r in rows}
    assert not urls & {d.url for d in blocked}
    assert "http://www.iana.org/" in urls

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / m.tokenizer.path))
    text = {r["url"]: tok.decode(r["input_ids"]) for r in rows}
    assert text["http://www.iana.org/"].lstrip().startswith(
        "Internet Assigned Numbers Authority")
    joined = "\n".join(text.values())
    assert "001c37" not in joined and "\ufffd" not in joined
