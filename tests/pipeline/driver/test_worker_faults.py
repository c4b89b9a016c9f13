"""Nodes that come and go (issue 24 item 6): a hung worker, inputs the workers cannot see, and
a separate Dask cluster that loses a worker and gains one mid-run with nothing shared but S3.

Real processes throughout: the CLI, a LocalCluster or a ``dask scheduler`` with ``dask worker``
processes, the loopback S3 server. Each result is compared byte for byte with a 1-worker run.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from pipeline.driver.worker_checks import (
    UnreadableInputError,
    check_not_all_unreadable,
    probe_inputs,
    probe_sample,
)
from pipeline.tasks.work import PhaseOne
from storage import read_manifest, resolve, shards_of
from tests.conftest import shakespeare_texts
from tests.pipeline._procs import (
    ENV,
    REPO,
    DaskCluster,
    done_markers,
    kill_tree,
    pipeline_cmd,
    wait_for,
)

pytestmark = pytest.mark.slow

PARTITION = "100000"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~2.5 MB of JSONL from real plays (with their natural duplicate paragraphs)."""
    root = tmp_path_factory.mktemp("worker_fault_corpus")
    for name in ("hamlet_gut.txt", "macbeth_gut.txt", "othello_gut.txt", "lear_gut.txt"):
        paras = [p for p in (shakespeare_texts() / name).read_text().split("\n\n") if p.strip()]
        lines = [json.dumps({"text": p, "id": f"{name}-{i}"}) for i, p in enumerate(paras)]
        (root / f"{name}.jsonl").write_text("\n".join(lines * 3) + "\n")
    return root


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The undisturbed 1-worker run everything is compared with."""
    out = tmp_path_factory.mktemp("worker_fault_reference") / "ds"
    run(PipelineConfig(inputs=[str(corpus / "*.jsonl")], output=str(out), workers=1,
                       id_field="id", partition_bytes=int(PARTITION),
                       dashboard_address="127.0.0.1:0"), progress=False)
    return out


def _args(corpus: Path, out: str) -> list[str]:
    return [str(corpus / "*.jsonl"), "--output", out, "--id-field", "id",
            "--partition-bytes", PARTITION]


def _objects(ref: Path) -> list[str]:
    m = read_manifest(str(ref))
    shards = shards_of(str(ref), m)
    assert len(shards) > 10 and m.index is not None
    return ["manifest.json", *(o.path for o in [*shards, *m.quarantine, m.index]),
            m.tokenizer.path]


def _assert_identical_local(ds: Path, ref: Path) -> None:
    for path in _objects(ref):
        assert (ds / path).read_bytes() == (ref / path).read_bytes(), path
    assert not (ds / "_work").exists()


def _spawned_workers(driver: int) -> list[psutil.Process]:
    """The LocalCluster's worker processes under a driver (its nannies live in the driver)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return [p for p in psutil.Process(driver).children(recursive=True)
                if "spawn_main" in " ".join(p.cmdline())]
    return []


def _listening(proc: psutil.Process) -> set[str]:
    """The addresses a worker process listens on (its worker port among them)."""
    ports = {f"127.0.0.1:{c.laddr.port}" for c in proc.net_connections("tcp")
             if c.status == psutil.CONN_LISTEN}
    assert ports, f"worker {proc.pid} listens on no port"
    return ports


# -- a hung worker ---------------------------------------------------------------------------

def test_a_stopped_worker_is_dropped_named_and_its_partitions_rerun(
        corpus: Path, reference: Path, tmp_path: Path) -> None:
    """SIGSTOP one of two LocalCluster workers mid-run and leave it stopped: the scheduler
    drops it after the worker TTL (its nanny, in the driver, heartbeats nothing for it), the
    driver names it in one warning line, the run finishes with the reference bytes. Before the
    TTL was set the run stalled until the worker was continued (5 min of Dask's default)."""
    out = tmp_path / "ds"
    started = time.monotonic()
    # --worker-ttl 10 (20 s by default): the drop comes in 10-20 s, and the test sooner
    proc = subprocess.Popen(pipeline_cmd(*_args(corpus, str(out)), "--workers", "2",
                                         "--worker-ttl", "10"), cwd=REPO,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    try:
        wait_for(lambda: len(done_markers(out)) >= 2 or proc.poll() is not None, 180,
                 "two finished partitions")
        assert proc.poll() is None, "the run ended before the stop: it proved nothing"
        workers = _spawned_workers(proc.pid)
        assert len(workers) == 2, workers
        victim = workers[0]
        addresses = _listening(victim)
        victim.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        stdout, stderr = proc.communicate(timeout=150)  # TTL 10 s, checked every 10 s, + redo
        took = time.monotonic() - stopped
    finally:
        if victim is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                victim.send_signal(signal.SIGCONT)
                victim.send_signal(signal.SIGKILL)
        kill_tree(proc.pid)
    assert proc.returncode == 0, stderr
    warned = [line for line in stderr.splitlines() if line.startswith("shardflow: warning: worker")]
    assert len(warned) == 1 and "no heartbeat" in warned[0], stderr
    assert any(f"worker tcp://{a} " in warned[0] for a in addresses), (addresses, warned)
    print(warned[0])
    print(f"SIGSTOP run: {time.monotonic() - started:.1f} s in all, {took:.1f} s after the stop")
    # ~10-20 s to notice, plus the redo and the close (the dropped worker killed after 1 s):
    # a stall bound with a loaded 2-core machine's margin, far below Dask's 5 min TTL
    assert took < 140, took
    _assert_identical_local(out, reference)


# -- inputs the workers cannot read ----------------------------------------------------------

def _unshare() -> list[str] | None:
    """How to start a process in a mount namespace of its own (root or user namespace)."""
    for cmd in (["unshare", "-m"], ["unshare", "-rm"]):
        if shutil.which(cmd[0]) and \
                subprocess.run([*cmd, "true"], capture_output=True).returncode == 0:
            return cmd
    return None


class _Cluster(DaskCluster):
    """``dask scheduler`` and ``dask worker`` processes, each worker with its own cwd, TMPDIR
    and local directory; ``hide`` folders are covered by an empty tmpfs in each worker's mount
    namespace, so they exist on the driver's disk only, as on another machine."""

    def __init__(self, tmp: Path, hide: list[Path] = ()) -> None:  # type: ignore[assignment]
        self.hide = hide
        super().__init__(tmp, {**ENV, "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "20s"})

    def launch(self, cmd: list[str]) -> subprocess.Popen[bytes]:
        home = self.tmp / f"worker{len(self.workers)}"
        (home / "tmp").mkdir(parents=True)
        cmd = [*cmd, "--local-directory", str(home / "local")]
        if self.hide:
            prefix = _unshare()
            assert prefix, "no mount namespace available"
            mounts = " && ".join(f"mount -t tmpfs none '{p}'" for p in self.hide)
            cmd = [*prefix, "sh", "-c", f'{mounts} && exec "$@"', "sh", *cmd]
        return subprocess.Popen(cmd, cwd=home, env={**ENV, "TMPDIR": str(home / "tmp")},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def _cluster(tmp: Path, workers: int, hide: list[Path] = ()):  # type: ignore[assignment]  # noqa: ANN202
    c = _Cluster(tmp, hide)
    try:
        for _ in range(workers):
            c.add_worker()
        c.wait_workers(workers)
        yield c
    finally:
        c.close()


def _s3_env(bucket) -> dict[str, str]:  # noqa: ANN001
    return {**ENV, "SHARDFLOW_STORAGE_OPTIONS": json.dumps(bucket.storage_options)}


def _s3_keys(bucket, prefix: str) -> list[str]:  # noqa: ANN001
    loc = resolve(bucket.url, bucket.storage_options)
    with contextlib.suppress(FileNotFoundError):
        found = loc.fs.find(loc.path(prefix), detail=True)
        return sorted(k for k, info in found.items() if info.get("type") == "file")
    return []


@pytest.mark.skipif(_unshare() is None, reason="needs a mount namespace (unshare -m or -rm)")
def test_inputs_only_the_driver_sees_stop_the_run_before_any_write(s3_bucket,
                                                                   tmp_path: Path) -> None:
    """Input on the driver's own disk, workers on "other machines" (the folder hidden under a
    tmpfs in their mount namespaces), output on S3: the run stops with one line naming the
    input and a worker, rc 2, and writes nothing. It used to quarantine every file as
    unreadable_file and commit an empty dataset with exit 0."""
    private = tmp_path / "driver_disk"
    private.mkdir()
    for i in range(3):
        (private / f"part{i}.jsonl").write_text(
            "".join(json.dumps({"text": f"document {i}-{j} of the driver"}) + "\n"
                    for j in range(4)))
    out = f"{s3_bucket.url}/ds"
    with _cluster(tmp_path / "cluster", 2, hide=[private]) as cluster:
        got = subprocess.run(
            pipeline_cmd(str(private / "*.jsonl"), "--output", out, "--scheduler",
                         cluster.address),
            cwd=REPO, env=_s3_env(s3_bucket), capture_output=True, text=True, timeout=300)
    assert got.returncode == 2, got.stdout + got.stderr
    errors = [line for line in got.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, got.stderr
    assert str(private / "part0.jsonl") in errors[0]
    assert "worker tcp://127.0.0.1:" in errors[0] and "cannot read" in errors[0]
    assert "Traceback" not in got.stderr
    print(errors[0])
    assert _s3_keys(s3_bucket, "ds") == []  # not a tokenizer, not a marker, not the lease


def test_a_run_whose_every_input_is_unreadable_commits_nothing(tmp_path: Path) -> None:
    """The net before the commit (for workers that joined after the probe, or inputs gone
    since the listing): every document an unreadable_file reject fails the run. Here the
    files open (the probe passes) but none decompresses."""
    for i in range(2):
        (tmp_path / f"broken{i}.jsonl.gz").write_bytes(b"not gzip at all\n" * 10)
    out = tmp_path / "ds"
    with pytest.raises(UnreadableInputError, match=r"broken0\.jsonl\.gz.*none of the 2 input"):
        run(PipelineConfig(inputs=[str(tmp_path / "*.jsonl.gz")], output=str(out), workers=1,
                           dashboard_address="127.0.0.1:0"), progress=False)
    assert not (out / "manifest.json").exists()


def test_the_net_leaves_runs_with_any_readable_document_alone() -> None:
    def one(i: int, docs: int, unreadable: int) -> PhaseOne:
        return PhaseOne(i, f"k{i}", docs_in=docs,
                        quarantined={"unreadable_file": unreadable} if unreadable else {})

    check_not_all_unreadable([one(0, 5, 0), one(1, 1, 1)])  # one bad file among good ones
    check_not_all_unreadable([one(0, 0, 0)])  # empty inputs: nothing to read, nothing lost
    with pytest.raises(UnreadableInputError, match="none of the 2 input files"):
        check_not_all_unreadable([one(0, 1, 1), one(1, 1, 1)])


def test_probe_sample_is_bounded_and_covers_every_folder() -> None:
    urls = [f"s3://b/d{d:03d}/f{f:04d}.jsonl" for d in range(50) for f in range(100)]
    sample = probe_sample(urls)
    assert len(sample) == 32 + 4 and len(set(sample)) == len(sample)
    assert sample[:32] == [f"s3://b/d{d:03d}/f0000.jsonl" for d in range(32)]
    assert probe_sample(urls) == sample  # seeded: the same inputs, the same sample
    assert probe_sample(["/a/x.txt"]) == ["/a/x.txt"]
    assert probe_sample([]) == []


async def _silent(*args: object) -> None:
    await asyncio.sleep(30)


def test_probe_names_the_input_and_gives_up_on_silence(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed import Client, LocalCluster

    import pipeline.driver.worker_checks as checks

    there = tmp_path / "there.jsonl"
    there.write_text("{}\n")
    gone = tmp_path / "gone.jsonl"
    log = io.StringIO()
    with LocalCluster(n_workers=2, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        assert probe_inputs(client, [str(there)], None, log) == 1
        with pytest.raises(UnreadableInputError) as err:
            probe_inputs(client, [str(there), str(gone)], None, log)
        assert str(err.value).startswith(f"{gone}: worker inproc://") and "\n" not in str(err.value)
        monkeypatch.setattr(checks, "can_read", _silent)
        started = time.monotonic()
        assert probe_inputs(client, [str(there)], None, log, timeout_s=1) == 0
        assert time.monotonic() - started < 20  # not the silent probe's 30 s
    assert log.getvalue().count("\n") == 1 and "within 1 s" in log.getvalue()


# -- a separate cluster, nothing shared but S3 -----------------------------------------------

def test_external_cluster_loses_a_worker_and_gains_one_with_identical_output(
        corpus: Path, reference: Path, s3_bucket, tmp_path: Path) -> None:
    """Three ``dask worker`` processes with private cwd, TMPDIR and local directories, output
    and scratch on S3; one is SIGKILLed after a few partitions and a new one joins mid-run;
    the dataset is byte-identical to the 1-worker run."""
    out = f"{s3_bucket.url}/ds"
    loc = resolve(out, s3_bucket.storage_options)
    with _cluster(tmp_path / "cluster", 3) as cluster:
        started = time.monotonic()
        proc = subprocess.Popen(pipeline_cmd(*_args(corpus, out), "--scheduler",
                                             cluster.address),
                                cwd=REPO, env=_s3_env(s3_bucket), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            def finished() -> int:
                return sum(1 for k in _s3_keys(s3_bucket, "ds/_work/done1")
                           if k.endswith(".done.json"))

            wait_for(lambda: finished() >= 3 or proc.poll() is not None, 180,
                     "three finished partitions", 0.2)
            assert proc.poll() is None, "the run ended before the kill: it proved nothing"
            kill_tree(cluster.workers[0].pid)
            cluster.add_worker()
            wait_for(lambda: cluster.count() == 3 or proc.poll() is not None, 60,
                     "the new worker", 0.2)
            joined_mid_run = proc.poll() is None
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            kill_tree(proc.pid)
        took = time.monotonic() - started
    assert proc.returncode == 0, stderr
    assert joined_mid_run, "the run ended before the new worker joined: it proved nothing"
    assert "dask: 3 workers" in stderr and "worker-ttl" not in stderr, stderr
    print(f"external cluster run with a kill and a join: {took:.1f} s")
    for path in _objects(reference):
        assert loc.fs.cat_file(loc.path(path)) == (reference / path).read_bytes(), path
    assert _s3_keys(s3_bucket, "ds/_work") == []

