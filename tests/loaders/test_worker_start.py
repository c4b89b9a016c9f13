"""DataLoader workers start the way a user's plain script expects: a training script with no
``if __name__ == "__main__":`` guard works with ``num_workers > 0`` (a spawn or forkserver
start re-runs such a script in every worker and fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_script_without_a_main_guard_reads_with_workers(tiny_dataset: str,
                                                          tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("from loaders import build_dataloader\n"
                      f"loader = build_dataloader({tiny_dataset!r}, 4, 64, num_workers=2)\n"
                      "print('BATCHES', sum(1 for _ in loader))\n")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split("BATCHES")[1]) > 0
