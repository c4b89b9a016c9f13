"""A trainer given credentials its store refuses (a wrong S3 secret) prints one ``error:``
line per rank, naming the object and what to check, with every secret redacted, and exits
2 (trainer/cli.py); it printed PermissionError tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fsspec

REPO = Path(__file__).resolve().parents[2]
WRONG = "wrong-secret-" + "z" * 24


def _trainer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def _upload(dataset: str, bucket) -> str:  # noqa: ANN001 - loopback_s3's S3Bucket
    fs = fsspec.filesystem("s3", **bucket.storage_options)
    fs.put(dataset, f"{bucket.name}/ds", recursive=True)
    return f"{bucket.url}/ds"


def _one_line(out: subprocess.CompletedProcess[str], secret: str) -> None:
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.startswith("error: access denied: ") and out.stderr.count("\n") == 1, \
        out.stderr[-3000:]
    assert secret not in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_a_wrong_secret_for_the_data_is_one_line_without_the_secret(
        tiny_vocab_dataset: str, s3_bucket, tmp_path: Path) -> None:  # noqa: ANN001
    url = _upload(tiny_vocab_dataset, s3_bucket)
    bad = {**s3_bucket.storage_options, "secret": WRONG}
    out = _trainer("--data", url, "--steps", "2", "--preset", "tiny",
                   "--storage-options", json.dumps(bad), "--run-dir", str(tmp_path / "run"))
    _one_line(out, WRONG)
    assert "manifest.json" in out.stderr and "'secret': '***'" in out.stderr


def test_a_wrong_secret_for_the_checkpoints_is_one_line_too(
        tiny_vocab_dataset: str, s3_bucket, tmp_path: Path) -> None:  # noqa: ANN001
    bad = {**s3_bucket.storage_options, "secret": WRONG}
    out = _trainer("--data", tiny_vocab_dataset, "--steps", "2", "--preset", "tiny",
                   "--seq-len", "16", "--batch-size", "2", "--run-dir", str(tmp_path / "run"),
                   "--checkpoint-dir", f"{s3_bucket.url}/ck",
                   "--checkpoint-storage-options", json.dumps(bad))
    _one_line(out, WRONG)
