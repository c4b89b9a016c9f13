"""The CLI as users meet it: --help, run (with its dashboard serving), inspect, errors."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import shakespeare_texts


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("sub", ["run", "inspect", "export"])
def test_help(sub: str) -> None:
    out = _cli(sub, "--help")
    assert out.returncode == 0
    assert f"Usage: python -m pipeline {sub}" in out.stdout
    assert "--storage-options" in out.stdout and "--replica-config" in out.stdout


def test_usage_errors_are_one_line_with_rc_2(tmp_path: Path) -> None:
    for args in (["run", "--min-chars", "lots"], ["run", "--no-such-flag"],
                 ["export", "x", "y", "--format", "csv"], ["inspect"], ["frobnicate"], [],
                 # the replica flags are flags only, never taken from extra positionals
                 ["inspect", "x", "y"], ["export", "x", "y", "z"], ["inspect", "--url", "x"],
                 # values the config's own checks refuse (not cyclopts'): no traceback either
                 ["run", "--dedup", "foo"], ["run", "--deadline", "24h"]):
        out = _cli(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr


def test_inspect_prints_summary(tiny_dataset: str) -> None:
    out = _cli("inspect", tiny_dataset)
    assert out.returncode == 0, out.stderr
    assert re.search(r"tokens\s+[\d,]{7,}", out.stdout)
    assert "gpt2 (vocab 50257" in out.stdout
    versions = out.stdout.split("\nversions", 1)[1].splitlines()[2:]
    assert len(versions) == 1 and versions[0].split()[0] == "1"
    assert versions[0].endswith("<- current")


def test_inspect_is_readable_and_its_json_is_the_manifest(tiny_dataset: str,
                                                         tmp_path: Path) -> None:
    """Counts with thousands separators, reasons as reason=count, the schema as column: type,
    the config one aligned key a line (values as JSON): no Python dict reprs. ``--json`` stays
    the manifest, for tools. Counts past a thousand are written into a copy's stats."""
    ds = tmp_path / "ds"
    shutil.copytree(tiny_dataset, ds, symlinks=True)
    manifest = json.loads((ds / "manifest.json").read_text())
    manifest["stats"].update(documents_in=1234567, dropped={"too_short": 3, "duplicate": 2345678},
                             quarantined={"malformed_record": 45678}, changed={"nfc": 1000})
    (ds / "manifest.json").write_text(json.dumps(manifest))
    out = _cli("inspect", str(ds))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "{'" not in text and "': " not in text, text
    lines = text.splitlines()
    assert f"documents   1,234,567 in, {manifest['totals']['rows']:,} out" in lines
    assert "dropped     duplicate=2,345,678, too_short=3" in lines
    assert "quarantined malformed_record=45,678" in lines
    assert "changed     nfc=1,000" in lines
    assert "schema      doc_id: string, input_ids: binary<uint16le>" in lines
    config = lines[lines.index("config") + 1:lines.index(next(
        line for line in lines if line.startswith("versions")))]
    steps = manifest["config"].pop("steps")  # the recipe: a step a line under its count
    at = next(i for i, line in enumerate(config) if line.startswith("  steps "))
    assert config[at].split() == ["steps", str(len(steps)), "step" + "s" * (len(steps) > 1)]
    assert [line.strip().split(" ")[0] for line in config[at + 1:at + 1 + len(steps)]] == \
        [s["name"] for s in steps]
    config = config[:at] + config[at + 1 + len(steps):]
    assert len(config) == len(manifest["config"]) > 10
    found = [re.fullmatch(r"  (\w+)( +)(.+)", line) for line in config]
    assert all(found), config
    assert len({len(m.group(1) + m.group(2)) for m in found if m}) == 1, "values not aligned"
    assert {m.group(1): json.loads(m.group(3)) for m in found if m} == manifest["config"]

    as_json = _cli("inspect", tiny_dataset, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stdout == (Path(tiny_dataset) / "manifest.json").read_text()


def test_run_summary_and_progress_use_thousands_separators() -> None:
    from pipeline.driver.job import RunSummary
    from pipeline.driver.progress import ProgressBar
    from storage.admin.versions import HistoryEntry, render_history

    text = RunSummary(
        output="out", partitions=12345, shards=12000, docs_in=1234567, docs_out=1200000,
        dropped={"duplicate": 34567}, quarantined={"malformed_record": 1000}, tokens=10**9,
        bytes=2 * 10**9, wall_s=10.0, resumed=2345, inputs=23456,
        empty_inputs=("a", "b")).render()
    lines = text.splitlines()
    assert "inputs       23,456 files (2 empty: a, b)" in lines
    assert ("partitions   12,345 -> 12,000 shards (2,345 phase-1 results reused from an earlier "
            "run)") in lines
    assert "documents    1,234,567 in, 1,200,000 out" in lines
    assert "dropped      duplicate=34,567" in lines
    assert "quarantined  malformed_record=1,000" in lines
    assert "tokens       1,000,000,000" in lines

    stream = io.StringIO()
    ProgressBar(12345, label="tasks", stream=stream).update(12345, tokens=5)  # the last: drawn
    assert "] 12,345/12,345 tasks " in stream.getvalue()

    table = render_history([HistoryEntry(None, True, shards=12345, tokens=67890)])
    assert "12,345" in table and "67,890" in table


def test_storage_options_from_a_file(tiny_dataset: str, tmp_path: Path) -> None:
    """@FILE keeps secrets out of /proc/PID/cmdline; a bad file is named, its content never
    shown."""
    opts = tmp_path / "opts.json"
    opts.write_text('{"auto_mkdir": true}')
    assert _cli("inspect", tiny_dataset, "--storage-options", f"@{opts}").returncode == 0
    opts.write_text('["secret-value-123"]')
    for sub in ("inspect", "run"):
        out = _cli(sub, tiny_dataset, "--storage-options", f"@{opts}")
        assert out.returncode == 2
        assert f"file {opts} must be a JSON object" in out.stderr
        assert "secret-value-123" not in out.stderr
    out = _cli("run", "--output", str(tmp_path / "ds"), "--storage-options",
               f"@{tmp_path / 'missing.json'}")
    assert out.returncode == 2 and "missing.json: cannot read (No such file" in out.stderr
    assert "@FILE" in _cli("run", "--help").stdout


def test_inspect_missing_dataset_is_a_clear_error(tmp_path: Path) -> None:
    out = _cli("inspect", str(tmp_path))
    assert out.returncode == 2
    assert "manifest.json is missing" in out.stderr and "Traceback" not in out.stderr


def test_dashboard_link_serves_while_the_run_goes(tmp_path: Path) -> None:
    """Start a run, read the dashboard link it prints, and fetch /status before it ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(shakespeare_texts() / "[a-l]*.txt"),
         "--output", str(tmp_path / "ds"), "--workers", "1", "--dashboard-address",
         "127.0.0.1:0"], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        link = None
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while link is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "the run ended before printing a dashboard link"
            found = re.search(r"dashboard (http://127\.0\.0\.1:\d+/status)", line)
            link = found.group(1) if found else None
        assert link, "no dashboard link printed"
        with urllib.request.urlopen(link, timeout=20) as resp:
            body = resp.read().decode()
        assert resp.status == 200 and "Dask" in body
        assert proc.poll() is None, "the run had already finished: the fetch proved nothing"
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        assert "tokens/s" in out
    finally:
        proc.kill()


def test_strict_stops_at_the_first_bad_record_naming_file_and_line(tmp_path: Path) -> None:
    src = tmp_path / "x.jsonl"
    src.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": 3}\n{"text": "ok"}\n')
    out = _cli("run", str(src), "--output", str(tmp_path / "ds"), "--strict", "--workers", "1",
               "--dashboard-address", ":0", "--no-progress")
    assert out.returncode == 3
    assert "x.jsonl:3" in out.stderr and "wrong_type" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "ds" / "manifest.json").exists()
