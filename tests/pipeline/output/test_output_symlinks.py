"""The pipeline does not write its output through a symlink out of the output folder (issue
22, item 2): every write goes through ``storage.write_atomic``, which refuses a symlinked
folder; the run fails naming it, and nothing lands outside."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import PipelineConfig
from pipeline.driver.job import run


def test_output_shards_symlinked_out_is_refused(corpus_dir: Path, tmp_path: Path) -> None:
    out, outside = tmp_path / "ds", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (out / "shards").symlink_to(outside, target_is_directory=True)
    cfg = PipelineConfig(inputs=[str(corpus_dir / "*.txt")], output=str(out), workers=1,
                         dashboard_address="127.0.0.1:0", row_group_tokens=8192)

    with pytest.raises(Exception, match="shards is a symlink") as caught:
        run(cfg, progress=False)
    assert str(outside) in str(caught.value)
    assert list(outside.iterdir()) == [], "the pipeline wrote outside its output"
    assert not (out / "manifest.json").exists()
