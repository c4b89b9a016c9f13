"""Files the project writes honour the umask, so other users of a shared filesystem can read
a dataset, a checkpoint or a cache (they were 0600: written via ``mkstemp`` and renamed)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage import resolve, write_atomic
from storage.io.atomic import process_umask

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    old = os.umask(0o022)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
            for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600),
                                            (0o002, 0o664)])
def test_write_atomic_gives_what_open_would(tmp_path: Path, umask, mask: int, mode: int) -> None:
    umask(mask)
    assert process_umask() == mask
    write_atomic(resolve(str(tmp_path)), "a/b.json", b"{}")
    assert _modes(tmp_path) == {"a/b.json": mode}


@pytest.mark.slow
def test_every_file_of_a_pipeline_run_honours_the_umask(tmp_path: Path) -> None:
    text = tmp_path / "in.jsonl"
    text.write_text("".join(f'{{"text": "document number {i} is here"}}\n' for i in range(50))
                    + "not json\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(text), "--output", str(tmp_path / "ds"),
         "--workers", "1", "--no-progress", "--dashboard-address", ":0"],
        cwd=REPO, capture_output=True, text=True, timeout=180,
        preexec_fn=lambda: os.umask(0o027), env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    modes = _modes(tmp_path / "ds")
    kinds = {name.split("/")[0] for name in modes}
    assert {"manifest.json", "shards", "quarantine"} <= kinds, modes
    assert any("tokenizer" in name for name in modes), modes
    assert set(modes.values()) == {0o640}, modes


def test_checkpoint_files_honour_the_umask(tmp_path: Path, umask) -> None:
    import torch
    from torch import nn

    from trainer.checkpoint.checkpointer import Checkpointer

    umask(0o022)
    model = nn.Linear(2, 2)
    Checkpointer(str(tmp_path / "ck")).save(1, model, torch.optim.AdamW(model.parameters()), {})
    modes = _modes(tmp_path / "ck")
    assert len(modes) >= 4 and set(modes.values()) == {0o644}, modes
