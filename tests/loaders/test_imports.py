"""``import loaders`` loads what a data loop needs and nothing else: no DCP (its Stateful is a
protocol the loader matches by shape), no S3 client until a URL needs one, no Dask."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_AT_IMPORT = ("torch.distributed.checkpoint", "s3fs", "obstore", "botocore", "aiobotocore",
                 "dask", "distributed", "pipeline", "cyclopts")


def test_import_loaders_loads_no_checkpointing_no_s3_client() -> None:
    code = ("import sys, loaders\n"
            "from loaders import build_dataloader, TokenDataset\n"
            f"bad = sorted(m for m in sys.modules if m.startswith({NOT_AT_IMPORT!r}))\n"
            "print(bad)\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_loader_is_still_a_dcp_stateful() -> None:
    from torch.distributed.checkpoint.stateful import Stateful

    from loaders.dataloader import ShardflowLoader

    assert issubclass(ShardflowLoader, Stateful)
