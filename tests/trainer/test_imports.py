"""The package rule from DESIGN.md, at run time: importing every trainer module (and the data
stack it uses) loads no Dask and no ``pipeline``. The source-level rule is checked for all
packages in ``tests/test_import_rules.py``; this one matters because ``trainer/__init__``
imports nothing, so ``import trainer`` alone proves little."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_importing_every_trainer_module_loads_no_dask() -> None:
    modules = sorted(m.name for m in pkgutil.iter_modules([str(REPO / "trainer")])
                     if m.name != "__main__")
    assert {"train", "data", "model", "cli", "plot"} <= set(modules)
    code = (
        "import importlib, sys, loaders, storage\n"
        f"for m in {modules!r}: importlib.import_module('trainer.' + m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('dask', 'distributed', 'pipeline'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
