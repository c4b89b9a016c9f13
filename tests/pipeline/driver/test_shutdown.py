"""A finished run's cluster goes down in order and quietly: no traceback, no ERROR line.

``make run`` once ended a successful run with a worker's ``ERROR - Failed to communicate with
scheduler during heartbeat`` and a ``CommClosedError`` traceback between the progress bar and
the summary (Dask's close of a LocalCluster gave each worker 4 s, then killed it). The cluster
is now closed client first, workers next (each given time to close), scheduler last:
:func:`pipeline.driver.cluster.close_in_order`. Shutdown is a race, so the real CLI with two
worker processes is what is run; the detection itself is shown to see a worker's ERROR line.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import shakespeare_texts
from tests.pipeline._procs import ENV, REPO, kill_tree, pipeline_cmd

#: a Python traceback, or a log line at ERROR or above (Dask's format: "... - ERROR - ...")
NOISE = re.compile(r"Traceback \(most recent call last\)|\bERROR\b|\bCRITICAL\b"
                   r"|still alive after .* killing")


def noise(output: str) -> list[str]:
    """The lines of ``output`` that a clean run must not print."""
    return [line for line in output.splitlines() if NOISE.search(line)]


def _run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``cmd`` with stdout and stderr in one stream, as a terminal shows them."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        kill_tree(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def test_a_clean_run_prints_no_traceback_and_no_error_line(tmp_path: Path) -> None:
    plays = tmp_path / "plays"
    plays.mkdir()
    for name in ("macbeth_gut.txt", "othello_gut.txt"):
        (plays / name).write_bytes((shakespeare_texts() / name).read_bytes())
    out = tmp_path / "ds"
    # small partitions: both workers get tasks, so both are busy until near the end
    done = _run(pipeline_cmd(str(plays / "*.txt"), "--output", str(out), "--workers", "2",
                             "--partition-bytes", "40000", "--no-card"))
    assert done.returncode == 0, done.stdout[-5000:]
    assert noise(done.stdout) == [], done.stdout[-5000:]
    # the output checked is the run's whole output: its cluster, its summary, its commit
    assert "dask: 2 workers" in done.stdout, done.stdout
    assert re.search(r"^partitions\s+\d+ -> \d+ shards", done.stdout, re.M), done.stdout
    assert re.search(r"^version\s+1 \(_versions/", done.stdout, re.M), done.stdout
    assert (out / "manifest.json").is_file()


def test_the_check_sees_a_worker_s_error_and_its_traceback(tmp_path: Path) -> None:
    """A worker process's ERROR log, as the heartbeat's was, reaches the output the check
    reads (the cluster's log level keeps errors: a quieter one would hide a failing run's
    cause), and the check names it."""
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent("""
        import logging

        from distributed.comm.core import CommClosedError

        from pipeline.driver.cluster import dask_client


        def heartbeat_fails():
            try:
                raise CommClosedError("in <TCP (closed) ConnectionPool.heartbeat_worker>")
            except CommClosedError:
                logging.getLogger("distributed.worker").exception(
                    "Failed to communicate with scheduler during heartbeat.")


        if __name__ == "__main__":
            with dask_client(2, dashboard_address="127.0.0.1:0") as client:
                client.run(heartbeat_fails)
            print("closed")
    """))
    done = _run([sys.executable, str(script)], timeout=180)
    assert done.returncode == 0, done.stdout[-5000:]
    assert done.stdout.rstrip().endswith("closed"), done.stdout[-5000:]
    found = noise(done.stdout)
    errors = [line for line in found if "ERROR - Failed to communicate with scheduler" in line]
    assert len(errors) == 2, done.stdout[-5000:]  # one per worker
    assert found.count("Traceback (most recent call last):") == 2, done.stdout[-5000:]
    # and the order of the close added nothing of its own
    assert len(found) == 4, found
