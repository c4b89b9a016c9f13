"""The dataset card (``card/<manifest sha16>/README.md`` + PNGs) of datasets made by the real
pipeline: the test plays (``tiny_dataset``, the demo's kind) and a web crawl in four languages
with drops, a quarantined record, exact and near duplicates and signal columns. Every number
the card prints is checked against the manifest or the shards as pyarrow reads them;
``pipeline card`` rebuilds the same bytes; gc keeps the cards of the versions it keeps; without
matplotlib the card is text only and says so."""

from __future__ import annotations

import json
import random
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from pipeline.output.card import README
from storage import ReplicaSet, commit, read_manifest, shards_of, tokens
from storage.format.checksums import digest_bytes
from tests.pipeline.select.web_views import TEXTS
from tests.pipeline.web import warcs

REPO = Path(__file__).resolve().parents[3]
PNG = b"\x89PNG\r\n\x1a\n"


def _cli(*args: str, pre: str = "", timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m pipeline ARGS`` in a child (``pre``: Python run first, e.g. an import
    blocker)."""
    code = f"{pre}\nimport sys\nfrom pipeline.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _card_dir(ds: str | Path) -> Path:
    tag = digest_bytes((Path(ds) / "manifest.json").read_bytes())[:16]
    return Path(ds) / "card" / tag


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR, after checking the signature and IHDR's CRC."""
    assert data[:8] == PNG
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16:29]
    assert struct.unpack(">I", data[29:33])[0] == zlib.crc32(data[12:29])
    assert data.endswith(b"IEND\xaeB`\x82")
    return struct.unpack(">II", body[:8])


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first Markdown table after ``heading`` (cells stripped)."""
    lines = text.splitlines()
    start = lines.index(heading)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif rows:
            break
    return rows[2:]  # past the header and the alignment row


def _n(s: str) -> int:
    return int(s.replace(",", "").split()[0])


def _lengths(ds: str | Path) -> np.ndarray:
    m = read_manifest(str(ds))
    parts = [tokens.lengths(pq.read_table(Path(ds) / s.path, columns=["input_ids"])
                            .column("input_ids"), m.schema["input_ids"])
             for s in shards_of(str(ds), m)]
    return np.concatenate(parts)


def _column(ds: str | Path, name: str) -> list:
    m = read_manifest(str(ds))
    return pa.concat_tables([pq.read_table(Path(ds) / s.path, columns=[name])
                             for s in shards_of(str(ds), m)]).column(name).to_pylist()


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """WET records in four languages (Spanish dropped by --languages), a few exact copies and
    near copies, a broken gzip member (quarantined), through the real job with the Gopher
    rules annotating, near-dup and dedup signals."""
    root = tmp_path_factory.mktemp("card-web")
    langs = ["en", "en", "de", "fr", "es", "en"]
    records = []
    for i in range(36):
        lang = langs[i % len(langs)]
        words = TEXTS[lang].replace("{i}", "").replace(",", "").replace(".", "").split()
        pick = random.Random(i)  # distinct texts of the language's words: no near copies
        sentences = [" ".join(pick.choice(words) for _ in range(12)).capitalize() + "."
                     for _ in range(4 + i % 9)]
        body = " ".join(sentences)
        records.append(warcs.conversion(f"https://{lang}.example/{i}", body))
        if i % 7 == 0:  # an exact copy under another URL
            records.append(warcs.conversion(f"https://{lang}.example/{i}?copy", body))
        if i % 5 == 0:  # a near copy: one word changed
            records.append(warcs.conversion(f"https://{lang}.example/{i}?near",
                                            body.replace(" ", " and ", 1)))
    warcs.write(root / "a.warc.wet.gz", records[:30])
    warcs.write(root / "b.warc.wet.gz", [*records[30:], warcs.bad_header_member()])
    out = root / "web"
    run(PipelineConfig(inputs=[str(root / "*.gz")], output=str(out), workers=1,
                       dashboard_address="127.0.0.1:0", languages="en,de,fr",
                       annotate="gopher", near_dup=True, dedup_signals=True,
                       files_per_partition=1, row_group_tokens=512), progress=False)
    return out


def test_the_demo_card_has_the_manifests_figures(tiny_dataset: str) -> None:
    m = read_manifest(tiny_dataset)
    st = m.stats
    text = (_card_dir(tiny_dataset) / README).read_text()
    summary = dict((k, v) for k, v in _table(text, f"# {Path(tiny_dataset).name}"))
    assert _n(summary["documents"]) == m.total_rows == st["documents_out"]
    assert _n(summary["tokens"]) == m.total_tokens == st["tokens"]
    assert summary["shards"].startswith(f"{m.counts.shards:,} ({m.counts.row_groups:,} row")
    # the way through the stages: each removes what the manifest counts, the last leaves out
    flow = _table(text, "## Documents through the steps")
    assert [r[0] for r in flow] == ["read", "clean", "dedup", "tokenize"]
    assert _n(flow[0][2]) == st["documents_in"]
    assert _n(flow[1][3]) == sum(v for k, v in st["dropped"].items() if k != "duplicate")
    assert _n(flow[2][3]) == st["dropped"]["duplicate"] > 0
    assert _n(flow[2][5]) == _n(flow[3][2]) == st["documents_out"]
    assert f"({m.total_tokens:,} tokens)" in flow[3][5]
    dropped = {r[0]: (r[1], _n(r[2])) for r in _table(text, "### Dropped, by reason")}
    assert {k: n for k, (_, n) in dropped.items()} == st["dropped"]
    assert dropped["duplicate"][0] == "dedup"
    assert dropped.get("empty", ("clean",))[0] == "clean"
    # lengths: every document's token count (the index's totals agree)
    lengths = _lengths(tiny_dataset)
    assert lengths.sum() == m.total_tokens and len(lengths) == m.total_rows
    table = dict(_table(text, "## Document length"))
    assert _n(table["min"]) == lengths.min() and _n(table["max"]) == lengths.max()
    for p in (10, 50, 90, 99):
        assert _n(table[f"p{p}"]) == round(float(np.percentile(lengths, p)))
    assert table["mean"] == f"{lengths.mean():,.1f}"
    assert "## Languages" not in text and "## Signals" not in text  # no such columns
    assert "No decontamination was recorded" in text
    assert 'use = "clean"' in text and f'build_dataloader("{tiny_dataset}"' in text
    # the pictures the text shows, beside it, readable
    shown = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert shown == ["flow.png", "lengths.png"]
    for name in shown:
        width, height = _png_size((_card_dir(tiny_dataset) / name).read_bytes())
        assert 500 <= width <= 1500 and 250 <= height <= 1200, (name, width, height)
    assert sorted(p.name for p in _card_dir(tiny_dataset).iterdir()) == sorted(
        [README, *shown])


def test_the_web_card_has_languages_drops_clusters_and_signals(web: Path) -> None:
    m = read_manifest(str(web))
    st = m.stats
    text = (_card_dir(web) / README).read_text()
    dropped = {r[0]: (r[1], _n(r[2])) for r in _table(text, "### Dropped, by reason")}
    assert {k: n for k, (_, n) in dropped.items()} == st["dropped"]
    assert dropped["language"][0] == "langid" and dropped["language"][1] > 0
    assert dropped["duplicate"][0] == dropped["near_duplicate"][0] == "dedup"
    quarantined = {r[0]: (r[1], _n(r[2])) for r in _table(text, "### Quarantined, by reason")}
    assert {k: n for k, (_, n) in quarantined.items()} == st["quarantined"]
    assert all(stage == "read" for stage, _ in quarantined.values())
    flow = _table(text, "## Documents through the steps")
    assert flow[0][0] == "read" and flow[-2][0] == "dedup"
    langid = next(r for r in flow if r[0] == "langid")
    assert _n(langid[3]) == st["dropped"]["language"] + st["dropped"].get("lang_score", 0)
    assert _n(flow[-2][3]) == st["dropped"]["duplicate"] + st["dropped"]["near_duplicate"]
    assert _n(flow[0][2]) == st["documents_in"]
    assert _n(flow[0][4]) == sum(st["quarantined"].values())
    assert _n(flow[-2][5]) == st["documents_out"]
    # languages: the lang column's counts, and tokens per language from the lengths
    langs = Counter(_column(web, "lang"))
    lengths = _lengths(web)
    by_lang: Counter[str] = Counter()
    for lang, n in zip(_column(web, "lang"), lengths, strict=True):
        by_lang[lang] += int(n)
    rows = _table(text, "## Languages")
    assert {r[0]: _n(r[1]) for r in rows} == dict(langs) and set(langs) == {"en", "de", "fr"}
    assert {r[0]: _n(r[3]) for r in rows} == dict(by_lang)
    assert [r[0] for r in rows] == sorted(langs, key=lambda k: (-langs[k], k))
    # near-duplicate clusters: the cluster_size column
    sizes = Counter(_column(web, "dedup.cluster_size"))
    clusters = {_n(r[0]): _n(r[1]) for r in _table(text, "## Near-duplicate clusters")}
    assert clusters == dict(sizes) and max(sizes) > 1
    assert sum(s * n for s, n in sizes.items()) == st["documents_out"] + st["dropped"][
        "duplicate"] + st["dropped"]["near_duplicate"]
    # signals: each column as inspect summarises it
    signals = text[text.index("## Signals"):text.index("## Near-duplicate")]
    for column in st["signals"]:
        assert f"  {column} " in signals, column
    shown = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert shown == ["flow.png", "languages.png", "lengths.png", "signals.png",
                     "clusters.png"]
    for name in shown:
        width, height = _png_size((_card_dir(web) / name).read_bytes())
        assert 500 <= width <= 2000 and 200 <= height <= 2500, (name, width, height)


def test_pipeline_card_rebuilds_the_same_bytes(web: Path, tmp_path: Path) -> None:
    ds = tmp_path / "web"
    shutil.copytree(web, ds)
    before = {p.name: p.read_bytes() for p in _card_dir(ds).iterdir()}
    shutil.rmtree(ds / "card")
    proc = _cli("card", str(ds))
    assert proc.returncode == 0, proc.stderr
    assert f"card/{_card_dir(ds).name}/README.md" in proc.stdout
    after = {p.name: p.read_bytes() for p in _card_dir(ds).iterdir()}
    # the same text; the pictures too, but for the dataset's path in the README (the copy's)
    assert set(after) == set(before)
    assert after[README].decode().replace(str(ds), str(web)) == before[README].decode()
    assert {k: v for k, v in after.items() if k != README} == {
        k: v for k, v in before.items() if k != README}
    assert not (ds / "_lease.json").exists()  # the writer lease, held and given back


def test_without_matplotlib_the_card_is_text_only_and_says_so(tiny_dataset: str,
                                                             tmp_path: Path) -> None:
    ds = tmp_path / "tiny"
    shutil.copytree(tiny_dataset, ds)
    block = ("import sys\nclass _NoMpl:\n    def find_spec(self, name, path=None, target=None):"
             "\n        if name.split('.')[0] == 'matplotlib':\n"
             "            raise ImportError('blocked for the test')\n"
             "sys.meta_path.insert(0, _NoMpl())")
    proc = _cli("card", str(ds), pre=block)
    assert proc.returncode == 0, proc.stderr
    assert "text only" in proc.stdout
    text = (_card_dir(ds) / README).read_text()
    assert "> **Text only:** matplotlib is not installed" in text
    assert "![" not in text
    assert [p.name for p in _card_dir(ds).iterdir()] == [README]  # the old PNGs removed
    assert "## Document length" in text and "| p50 |" in text  # the figures as text


def test_gc_keeps_the_cards_of_kept_versions_only(tiny_dataset: str, tmp_path: Path) -> None:
    ds = tmp_path / "tiny"
    shutil.copytree(tiny_dataset, ds)
    first = _card_dir(ds)
    store = ReplicaSet.from_urls([str(ds)])
    m = read_manifest(str(ds))
    # a second version naming the same objects (a config key changed), with its own card
    import dataclasses

    commit(store, dataclasses.replace(m, config={**m.config, "card_test": 2}))
    proc = _cli("card", str(ds))
    assert proc.returncode == 0, proc.stderr
    second = _card_dir(ds)
    assert second != first and (second / README).exists() and (first / README).exists()
    (ds / "card" / "notes.txt").write_text("not gc's")
    orphan = ds / "card" / ("f" * 16)  # the card of a version that was never committed
    orphan.mkdir()
    (orphan / README).write_text("orphan")
    gc = subprocess.run([sys.executable, "-m", "storage", "gc", str(ds), "--keep", "2",
                         "--min-age", "0"], cwd=REPO, capture_output=True, text=True,
                        timeout=120)
    assert gc.returncode == 0, gc.stderr
    assert (first / README).exists() and (second / README).exists()
    assert not orphan.exists() or not any(orphan.iterdir())
    gc = subprocess.run([sys.executable, "-m", "storage", "gc", str(ds), "--keep", "1",
                         "--min-age", "0"], cwd=REPO, capture_output=True, text=True,
                        timeout=120)
    assert gc.returncode == 0, gc.stderr
    assert f"card/{first.name}/README.md" in gc.stdout
    assert not (first / README).exists() and not (first / "flow.png").exists()
    assert sorted(p.name for p in second.iterdir()) == sorted(
        [README, "flow.png", "lengths.png"])
    assert (ds / "card" / "notes.txt").read_text() == "not gc's"
    verify = subprocess.run([sys.executable, "-m", "storage", "verify", str(ds)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_export_hf_carries_the_card_and_its_pictures(web: Path, tmp_path: Path) -> None:
    from pipeline.output.export import export

    export(ReplicaSet.from_urls([str(web)]), str(tmp_path / "hf"), "hf", progress=False)
    readme = (tmp_path / "hf" / "README.md").read_text()
    card = (_card_dir(web) / README).read_text()
    assert readme.startswith("---\nconfigs:\n") and card in readme
    assert "## This export" in readme
    for name in re.findall(r"!\[[^]]*\]\(([^)]+)\)", card):
        assert (tmp_path / "hf" / name).read_bytes() == (_card_dir(web) / name).read_bytes()


def test_the_card_reports_what_decontamination_found(corpus_dir: Path, tmp_path: Path) -> None:
    """A run with --decontaminate and a passage of Hamlet planted in an eval set (changed
    case and punctuation): the card's row is the manifest's count and the report's."""
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "planted.jsonl").write_text(json.dumps({"text": (
        "FELL INTO A SADNESS, then into a fast; thence to a watch -- thence into a weakness; "
        "thence to a lightness")}) + "\n" + json.dumps({"text": "nothing of the plays here "
        "at all, only words that no play of these three has in this order ever"}) + "\n")
    (evals / "clean.jsonl").write_text(json.dumps({"text": " ".join(
        f"word{i}" for i in range(40))}) + "\n")
    out = tmp_path / "ds"
    run(PipelineConfig(inputs=[str(corpus_dir / "hamlet_gut.txt")], output=str(out),
                       workers=1, dashboard_address="127.0.0.1:0",
                       decontaminate=f"{evals}/*.jsonl"), progress=False)
    m = read_manifest(str(out))
    found = m.stats["contamination"]["documents"]
    assert found == {"decontaminate.planted": 1, "decontaminate.clean": 0}
    text = (_card_dir(out) / README).read_text()
    rows = {r[0]: r[1:] for r in _table(text, "## Decontamination")}
    assert rows == {"clean": ["1", "0", "-"], "planted": ["2", "1", "1"]}
    assert "fell into a sadness then into a fast" in text  # the report's matched n-gram
    dropped = {r[0]: r[1] for r in _table(text, "### Dropped, by reason")}
    assert dropped["decontaminate.planted"] == "decontaminate"
    # the version's report is its own object, named by the manifest; the root's copy is the
    # latest run's, and a report that does not match the manifest is not shown as the version's
    report = m.stats["contamination"]["report"]
    assert report.startswith("contamination/") and report in {r.path for r in m.reports}
    assert (out / report).read_bytes() == (out / "contamination.json").read_bytes()
    (out / "contamination.json").write_text(json.dumps({"format": "x", "steps": {}}))
    (out / report).write_text(json.dumps({"format": "x", "steps": {}}))
    from pipeline.output.card import rebuild

    rebuild(ReplicaSet.from_urls([str(out)]), str(out))
    text = (_card_dir(out) / README).read_text()
    assert f"{report} is not this version's" in text
    rows = {r[0]: r[1:] for r in _table(text, "## Decontamination")}
    assert rows["planted"] == ["1", "1"]  # the manifest's own counts remain


def test_select_writes_the_card_of_a_view_which_counts_its_kept_documents(web: Path) -> None:
    view = web.parent / "web-en"
    proc = _cli("select", str(web), "--where", "lang = 'en'", "--output", str(view),
                "--no-progress")
    assert proc.returncode == 0, proc.stderr
    written = {p.name: p.read_bytes() for p in _card_dir(view).iterdir()}
    assert README in written and any(n.endswith(".png") for n in written)
    proc = _cli("card", str(view))  # rebuilt from the committed view: the same bytes
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.read_bytes() for p in _card_dir(view).iterdir()} == written
    m = read_manifest(str(view))
    text = (_card_dir(view) / README).read_text()
    assert "## A view" in text and "where `lang = 'en'`" in text
    assert "## Documents through the steps" not in text  # select chose them, not steps
    rows = _table(text, "## Languages")
    assert [(r[0], _n(r[1])) for r in rows] == [("en", m.total_rows)]
    assert _n(dict(_table(text, f"# {view.name}"))["tokens"]) == m.total_tokens
    assert sum(_n(r[1]) for r in _table(text, "## Near-duplicate clusters")) == m.total_rows


def test_select_no_card_writes_none(web: Path) -> None:
    view = web.parent / "web-en-bare"
    proc = _cli("select", str(web), "--where", "lang = 'en'", "--output", str(view),
                "--no-progress", "--no-card")
    assert proc.returncode == 0, proc.stderr
    assert (view / "manifest.json").is_file() and not (view / "card").exists()


def test_pipeline_card_writes_every_replica(tiny_dataset: str, tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "tiny", tmp_path / "b" / "tiny"
    for d in (a, b):
        shutil.copytree(tiny_dataset, d)
        shutil.rmtree(d / "card")
    proc = _cli("card", str(a), "--replica", str(b), "--sample-rows", "1000")
    assert proc.returncode == 0, proc.stderr
    files = {p.name: p.read_bytes() for p in _card_dir(a).iterdir()}
    assert files == {p.name: p.read_bytes() for p in _card_dir(b).iterdir()}
    text = files[README].decode()
    m = read_manifest(str(a))
    assert f"From an evenly spaced sample of {1000:,} of the {m.total_rows:,} documents" in text
    assert not (a / "_lease.json").exists() and not (b / "_lease.json").exists()


def test_pipeline_card_on_s3_writes_the_same_card(tiny_dataset: str, s3_bucket) -> None:  # noqa: ANN001
    """The dataset's objects copied to a real S3 bucket (loopback): the card is read through
    the S3 client and put with the store's put, and only its URL differs."""
    from pipeline.output.card import rebuild
    from storage import resolve

    opts = s3_bucket.storage_options
    url = f"{s3_bucket.url}/tiny"
    remote = resolve(url, opts)
    local = Path(tiny_dataset)
    for path in sorted(local.rglob("*")):
        rel = path.relative_to(local).as_posix()
        if path.is_file() and not rel.startswith(("card/", "_lease")):
            remote.fs.pipe_file(remote.path(rel), path.read_bytes())
    summary = rebuild(ReplicaSet.from_urls([url], opts), url)
    where = f"card/{_card_dir(local).name}"
    assert summary.card.readme == f"{where}/README.md"
    for path in _card_dir(local).iterdir():
        got = remote.fs.cat_file(remote.path(f"{where}/{path.name}"))
        want = path.read_bytes()
        if path.name == README:
            got, want = got.replace(url.encode(), b"URL"), want.replace(
                str(local).encode(), b"URL")
        assert got == want, path.name
