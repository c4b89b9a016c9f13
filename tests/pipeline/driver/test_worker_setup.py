"""Workers import Shardflow whatever directory the run (or the worker) was started from.

The reported hazard: with the editable install, each Dask worker's local directory (holding
the spill folder ``storage/``) comes first on ``sys.path`` and shadows the ``storage`` package;
a run started outside the repository root then waited forever.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.driver.worker_setup import WorkerImportError, check_imports, unshadow
from tests.pipeline._procs import kill_tree, wait_for

#: The environment of a user's shell: no PYTHONPATH pointing at the checkout.
USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}


def _corpus(tmp: Path) -> Path:
    text = tmp / "in.txt"
    text.write_text("\n\n".join(f"paragraph {i} says something new" for i in range(40)) + "\n")
    return text


@pytest.mark.slow
def test_run_from_an_unrelated_directory_completes(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(_corpus(tmp_path)), "--output",
         str(tmp_path / "ds"), "--workers", "2", "--no-progress", "--dashboard-address", ":0"],
        cwd=elsewhere, env=USER_ENV, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["stats"]["documents_out"] == 40


@pytest.mark.slow
def test_a_worker_that_cannot_import_ends_the_run_with_one_clear_line(tmp_path: Path) -> None:
    """An external worker started in a directory whose ``storage/`` folder shadows the
    package: the run stops at once with exit 2 and says why, instead of hanging."""
    bad_cwd = tmp_path / "bad"
    (bad_cwd / "storage").mkdir(parents=True)
    env = {**USER_ENV, "PYTHONPATH": ""}
    sched_file = tmp_path / "scheduler.json"
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        wait_for(lambda: sched_file.exists() and "address" in sched_file.read_text(), 60,
                 "the scheduler", 0.1)
        address = json.loads(sched_file.read_text())["address"]
        # `python -m` puts the cwd first on sys.path, as a shell user's worker would have it
        worker = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
             "--no-nanny", "--host", "127.0.0.1", "--no-dashboard"],
            env=env, cwd=bad_cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from distributed import Client

        with Client(address, timeout=30) as c:
            c.wait_for_workers(1, timeout=60)
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline", "run", str(_corpus(tmp_path)), "--output",
             str(tmp_path / "ds"), "--scheduler", address, "--no-progress"],
            cwd=tmp_path, env=USER_ENV, capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - start
    finally:
        for p in (worker, scheduler):
            if p is not None:
                kill_tree(p.pid)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "start the worker from another directory" in errors[0]
    assert "Traceback" not in proc.stderr
    assert elapsed < 60
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_unshadow_removes_the_local_directory_and_a_namespace_impostor(tmp_path: Path,
                                                                     monkeypatch) -> None:
    (tmp_path / "storage").mkdir()
    # as on a worker: the local directory first, the package found only by the install's
    # import hook (the editable finder), not by a sys.path entry such as the checkout root
    others = [p for p in sys.path if not (Path(p or ".") / "storage" / "__init__.py").exists()]
    monkeypatch.setattr(sys, "path", [str(tmp_path), *others])
    saved = {k: v for k, v in sys.modules.items() if k == "storage" or k.startswith("storage.")}
    del sys.modules["storage"]
    try:
        import storage as impostor  # the empty folder, as a namespace package

        assert getattr(impostor, "__file__", None) is None
        unshadow(str(tmp_path))
        assert str(tmp_path) not in sys.path
        import storage

        assert storage.__file__ and hasattr(storage, "resolve")
    finally:  # the rest of the session keeps the module objects it already holds
        for key in [k for k in sys.modules if k == "storage" or k.startswith("storage.")]:
            del sys.modules[key]
        sys.modules.update(saved)


def test_check_imports_names_the_module_and_the_fix() -> None:
    with pytest.raises(WorkerImportError, match="cannot import 'no_such_module_xyz'.*install"):
        check_imports(("no_such_module_xyz",))
