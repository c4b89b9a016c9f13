"""Input discovery: errors a user meets when listing inputs, and empty inputs."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.planning.discovery import discover
from pipeline.records import InputError

REPO = Path(__file__).resolve().parents[3]
SECRET = "s3cr3t-never-printed"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _options(port: int) -> dict:
    return {"key": "AKIDEXAMPLE", "secret": SECRET,
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}


def test_unreachable_s3_input_is_one_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    start = time.monotonic()
    with pytest.raises(InputError, match=r"s3://bucket/\*\.jsonl: cannot list the input") as e:
        discover(["s3://bucket/*.jsonl"], _options(_closed_port()))
    assert time.monotonic() - start < 20
    assert SECRET not in str(e.value) and "\n" not in str(e.value)


def test_unreachable_s3_input_on_the_command_line_exits_2_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "s3://bucket/raw/*.jsonl", "--output",
         str(tmp_path / "ds"), "--storage-options", json.dumps(_options(_closed_port())),
         "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: s3://bucket/raw/*.jsonl"), lines
    assert "Traceback" not in proc.stderr and SECRET not in proc.stderr + proc.stdout
    assert time.monotonic() - start < 60


def test_missing_local_input_names_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        discover([str(tmp_path / "absent.jsonl")])
    with pytest.raises(InputError, match="no input files match"):
        discover([str(tmp_path / "*.jsonl")])


def test_zero_byte_inputs_are_discovered_with_size_zero(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl.gz").write_bytes(b"")
    (tmp_path / "full.jsonl.gz").write_bytes(gzip.compress(b'{"text": "hello"}\n'))
    files = discover([str(tmp_path / "*.jsonl.gz")])
    assert [(Path(f.url).name, f.size == 0) for f in files] == [("empty.jsonl.gz", True),
                                                                ("full.jsonl.gz", False)]


@pytest.mark.slow
def test_a_zero_byte_gzip_input_is_counted_as_empty_in_the_summary(tmp_path: Path) -> None:
    import io

    from pipeline.config import PipelineConfig
    from pipeline.driver.job import run

    (tmp_path / "a_empty.jsonl.gz").write_bytes(b"")
    good = [f"record {i} is a good one" for i in range(20)]
    (tmp_path / "b_full.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in good).encode()))
    log = io.StringIO()
    summary = run(PipelineConfig(inputs=[str(tmp_path / "*.jsonl.gz")],
                                 output=str(tmp_path / "ds"), workers=1,
                                 dashboard_address="127.0.0.1:0"), log=log, progress=False)
    assert summary.inputs == 2 and len(summary.empty_inputs) == 1
    assert summary.empty_inputs[0].endswith("a_empty.jsonl.gz")
    assert "inputs       2 files (1 empty: " in summary.render()
    assert "1 empty input files (0 bytes)" in log.getvalue()
    assert summary.docs_out == len(good)
