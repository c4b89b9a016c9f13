"""``--languages`` is checked against the codes the language identifier knows
(pipeline/web/langid.py): ``--languages xx`` kept no document at all and exited 0, since no
page is ever identified as ``xx``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import PipelineConfig

REPO = Path(__file__).resolve().parents[3]


def test_known_codes_pass_and_unknown_ones_are_named() -> None:
    assert PipelineConfig(languages="en, DE").web_config.languages == ("de", "en")  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"^--languages: unknown language code 'xx' "
                                         r"\(py3langid knows: .*\bde\b.*\ben\b"):
        PipelineConfig(languages="en,xx")
    with pytest.raises(ValueError, match=r"unknown language codes 'english', 'zz'"):
        PipelineConfig(languages="english,de,zz")


def test_an_unknown_code_on_the_command_line_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("The committee met on Tuesday to review the plan.\n")
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(tmp_path / "a.txt"), "--no-progress",
         "-o", str(tmp_path / "ds"), "--workers", "1", "--dashboard-address", "127.0.0.1:0",
         "--languages", "xx"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
    assert out.stderr.startswith("error: --languages: unknown language code 'xx' ") \
        and out.stderr.count("\n") == 1, out.stderr
