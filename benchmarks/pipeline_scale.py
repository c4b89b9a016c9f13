"""How the pipeline's driver and scheduler scale with the input: 1 TB -> 100 TB, 10 k -> 10 M
files (issue 24), on simulated inputs.

The input is a synthetic fsspec filesystem (``synth://``) that declares ``--files`` text files
of ``--input-tb / --files`` bytes each and lists them a page of 1,000 at a time, as an S3
prefix's listing comes (nothing is read). Through the real driver code:
:func:`pipeline.planning.discovery.discover_table` (the compact file table, filled a page at a
time),
:func:`pipeline.planning.plan.auto_partition_bytes` and
:class:`pipeline.planning.plan.PartitionPlan`, the
completion state (:func:`pipeline.tasks.work.read_state`) and the job's lazy submission (a
partition's key and marker lookup as its task is submitted), then the bounded
:class:`pipeline.driver.window.TaskWindow` on a real ``dask scheduler`` process with two
``dask worker`` processes. The tasks are stand-ins of ``--task-ms`` that leave a phase-1
marker as phase 1 does, compacted into ledgers by the driver (phase 1 does the real work;
here the driver and the scheduler are measured), at most ``--max-tasks`` of them: a window
that holds a bounded number of tasks costs the same per task at any count. Resume planning
is then a rerun's: read the ledgers, and pass over every partition (its key, the run key, its
marker looked up) to find those left.

Per point: driver and scheduler peak RSS, most live tasks, time to the first task result from
the start (listing and planning included), the scheduler's overhead per task (wall time of the
tasks beyond their own duration, per task, on 2 threads) and the resume-planning time.

    python benchmarks/pipeline_scale.py                       # the sweep, JSON + plot
    python benchmarks/pipeline_scale.py --input-tb 100 --files 10000000 --json   # one point
    python benchmarks/pipeline_scale.py --sparse-run     # the real job on 2 TiB of sparse files

``--sparse-run`` is the issue's user run: ``--sparse-files`` sparse text files of
``--sparse-gib`` GiB each (``truncate``: no disk used; they read as NUL bytes) through the real
``python -m pipeline run`` with a LocalCluster of one worker and ``--no-progress``, its driver
process's RSS (client + in-process scheduler) sampled every second until
``--sparse-partitions`` partitions are done (phase-1 markers) or ``--sparse-budget-s`` passed;
then the run is stopped and its input and output removed. JSON: pipeline_scale_sparse.json.

The baseline of the comparison is the sweep's own first point (1 TB, 10 k files): the targets
are flat memory (within 10 % of it) and absolute bounds (driver and scheduler <= 1 GB, at most
20 k live tasks, first task <= 30 s, overhead <= 1 % of a task).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import psutil
from fsspec.spec import AbstractFileSystem

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, write_results  # noqa: E402

SWEEP = [(1, 10_000), (10, 100_000), (100, 1_000_000), (100, 10_000_000)]
TB = 10**12


class SyntheticFS(AbstractFileSystem):
    """``synth://N/BYTES/``: ``N`` files ``fNNNNNNNNN.txt`` of ``BYTES`` each; listing only."""

    protocol = "synth"
    root_marker = ""

    @staticmethod
    def _shape(path: str) -> tuple[int, int]:
        n, size = path.replace("synth://", "").strip("/").split("/")[:2]
        return int(n), int(size)

    def glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        n, size = self._shape(path)
        base = f"{n}/{size}"
        out = {f"{base}/f{i:09d}.txt": {"name": f"{base}/f{i:09d}.txt", "size": size,
                                         "type": "file", "mtime": 0.0} for i in range(n)}
        return out if kwargs.get("detail") else list(out)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        _, size = self._shape(path)
        return {"name": path, "size": size, "type": "file"}

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self.glob(path + "/*", detail=detail)

    def ls_pages(self, folder: str, page: int = 1000) -> Any:
        """The folder's files a page of ``page`` at a time, as an S3 listing comes."""
        n, size = self._shape(folder)
        base = f"{n}/{size}"
        for lo in range(0, n, page):
            yield [{"name": f"{base}/f{i:09d}.txt", "size": size, "type": "file", "mtime": 0.0}
                   for i in range(lo, min(n, lo + page))]


fsspec.register_implementation("synth", SyntheticFS, clobber=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peak:
    """The peak RSS of processes, sampled every 50 ms in a thread."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {k: psutil.Process(p) for k, p in pids.items()}
        self.peak = {k: 0 for k in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.sample()

    def sample(self) -> None:
        for k, proc in self.procs.items():
            with contextlib.suppress(psutil.Error):  # a process that ended keeps its peak
                self.peak[k] = max(self.peak[k], proc.memory_info().rss)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        self.sample()
        return self.peak


def _stand_in(ms: float, path: str, marker: str) -> str:
    """A phase-1 task's stand-in: sleeps, then leaves its marker (``marker`` at ``path``, a
    local file) as phase 1 does. Plain files: the workers import nothing of Shardflow."""
    time.sleep(ms / 1000)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        fh.write(marker)
    os.replace(path + ".tmp", path)
    return path


def _cluster(tmp: Path) -> tuple[str, list[subprocess.Popen[bytes]]]:
    port = _free_port()
    env = {**os.environ, "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "error"}
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--dashboard-address", ":0"], cwd=tmp, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"tcp://127.0.0.1:{port}"
    workers = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
         "--no-nanny", "--local-directory", str(tmp / f"w{i}"), "--no-dashboard"],
        cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(2)]
    return address, [scheduler, *workers]


def measure(input_tb: float, files: int, task_ms: float, max_tasks: int) -> dict[str, Any]:
    """One point of the sweep (run in a fresh process: peak RSS is per process)."""
    from distributed import Client

    from pipeline.driver.window import TaskWindow
    from pipeline.planning.discovery import discover_table
    from pipeline.planning.plan import PartitionPlan, auto_partition_bytes
    from pipeline.tasks import work
    from storage import ReplicaSet

    size = int(input_tb * TB // files)
    tmp = Path(tempfile.mkdtemp(prefix="pipeline-scale-"))
    address, procs = _cluster(tmp)
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            peak = Peak({"driver": os.getpid(), "scheduler": procs[0].pid})
            t0, c0 = time.perf_counter(), time.process_time()
            table = discover_table([f"synth://{files}/{size}/*.txt"])
            listed_s = time.perf_counter() - t0
            part_bytes = auto_partition_bytes(table.total_bytes)
            plan = PartitionPlan(table, part_bytes)
            planned_s = time.perf_counter() - t0
            scratch = work.work_store(ReplicaSet.from_urls([str(tmp / "out")]))
            salt = "bench"

            def rerun_plan(state: dict[str, Any] | None) -> Any:
                """What the job's phase-1 submission does per partition: its key, the run
                key's hash, its marker looked up; yields the partitions left to do."""
                hasher = hashlib.sha256()
                for i in range(len(plan)):
                    k = plan.key(i, salt)
                    hasher.update((f"\n{k}" if i else k).encode())
                    if state is None or work.done1_path(k) not in state:
                        yield i, k

            state = work.read_state(scratch, work.DONE1_DIR)  # a fresh _work/: empty
            results = work.PhaseOneResults(len(plan))  # what the job keeps per partition
            window = TaskWindow(client)
            ledger = work.Compactor(scratch, work.DONE1_DIR)
            first: float | None = None
            first_cpu = 0.0
            t_tasks = time.perf_counter()

            def submit(task: tuple[int, str]) -> Any:
                i, k = task
                marker = json.dumps(work.marker(work.PhaseOne(i, k)), sort_keys=True)
                return client.submit(_stand_in, task_ms,
                                     str(tmp / "out" / work.done1_path(k)), marker,
                                     key=f"t-{i}", pure=False)

            for (i, k), _path in window.run(submit,
                                            itertools.islice(rerun_plan(state), max_tasks)):
                if first is None:
                    first = time.perf_counter() - t0
                    first_cpu = time.process_time() - c0
                one = work.PhaseOne(i, k)
                ledger.add(work.done1_path(k), one)
                results.add(one)
            ledger.flush()
            tasks_s = time.perf_counter() - t_tasks
            run = min(max_tasks, len(plan))
            # A rerun's planning: read the completion state (ledgers, loose markers), then
            # the pass over every partition that finds those left (all keys, the run key).
            t_resume, c_resume = time.perf_counter(), time.process_time()
            state = work.read_state(scratch, work.DONE1_DIR)
            left = sum(1 for _ in rerun_plan(state))
            resume_s = time.perf_counter() - t_resume
            resume_cpu = time.process_time() - c_resume
            assert left == len(plan) - run, (left, len(plan), run)
            rss = peak.stop()
        threads = 2
        ideal = run * task_ms / 1000 / threads
        overhead_ms = max(0.0, (tasks_s - ideal) * threads / max(1, run) * 1000)
        return {
            "input_tb": input_tb, "files": files, "partitions": len(plan),
            "partition_bytes": part_bytes, "tasks_run": run, "task_ms": task_ms,
            "table_mb": round(table.nbytes() / 2**20, 1), "ledgers": ledger.written,
            # the table's temporary files (its columns past filetable.SPILL_ROWS rows)
            "table_spill_mb": round(table.spill_bytes() / 2**20, 1),
            "driver_peak_rss_mb": round(rss["driver"] / 2**20, 1),
            "scheduler_peak_rss_mb": round(rss["scheduler"] / 2**20, 1),
            "max_live_tasks": window.max_live,
            "first_task_s": round(first or 0.0, 3),
            "listing_s": round(listed_s, 3), "planning_s": round(planned_s, 3),
            "resume_planning_s": round(resume_s, 3),
            # the driver's CPU time for the same spans: what the wall time is on an idle
            # machine (this work is one thread), readable on a loaded one
            "first_task_cpu_s": round(first_cpu, 3),
            "resume_planning_cpu_s": round(resume_cpu, 3),
            "overhead_per_task_ms": round(overhead_ms, 3),
            "overhead_pct_of_task": round(100 * overhead_ms / task_ms, 2) if task_ms else None,
        }
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)  # the markers, ledgers and worker folders


def sparse_run(files: int, gib: float, partition_bytes: int, stop_at: int,
               budget_s: float) -> dict[str, Any]:
    """The real job on sparse files until ``stop_at`` partitions are done (module docstring)."""
    import shutil
    import signal

    tmp = Path(tempfile.mkdtemp(prefix="pipeline-sparse-"))
    src, out = tmp / "in", tmp / "out"
    src.mkdir()
    size = int(gib * 2**30)
    for i in range(files):
        with open(src / f"f{i:05d}.txt", "wb") as fh:
            fh.truncate(size)  # sparse: no block is written
    log = tmp / "run.log"
    cmd = [sys.executable, "-m", "pipeline", "run", str(src / "*.txt"), "-o", str(out),
           "--workers", "1", "--no-progress", "--partition-bytes", str(partition_bytes)]
    samples: list[tuple[float, float, int]] = []  # (s since start, driver RSS MB, done)
    done_dir = out / "_work" / "done1"
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        driver = psutil.Process(proc.pid)
        while proc.poll() is None:
            t = time.perf_counter() - t0
            try:
                with os.scandir(done_dir) as it:
                    done = sum(1 for e in it if e.name.endswith(".done.json"))
            except FileNotFoundError:
                done = 0
            with contextlib.suppress(psutil.Error):
                samples.append((round(t, 1), round(driver.memory_info().rss / 2**20, 1), done))
            if done >= stop_at or t >= budget_s:
                break
            time.sleep(1.0)
        rc = proc.poll()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        text = log.read_text(errors="replace")
        used_mb = sum(e.stat().st_blocks * 512 for e in os.scandir(src)) / 2**20
        shutil.rmtree(tmp, ignore_errors=True)
    plan_line = next((ln for ln in text.splitlines() if ln.startswith("shardflow:")), "")
    rss = [r for _, r, _ in samples]
    late = [r for t, r, d in samples if d > 0]  # from the first finished partition on
    return {
        "files": files, "file_gib": gib, "partition_bytes": partition_bytes,
        "plan": plan_line, "exit_code": rc, "stopped_by": "run ended" if rc is not None else (
            "partitions" if samples and samples[-1][2] >= stop_at else "time budget"),
        "partitions_done": samples[-1][2] if samples else 0,
        "wall_s": round(time.perf_counter() - t0, 1),
        "driver_peak_rss_mb": max(rss, default=0.0),
        "driver_rss_first_done_mb": late[0] if late else None,
        "driver_rss_last_mb": rss[-1] if rss else None,
        "driver_rss_growth_after_first_mb": round(max(late) - late[0], 1) if late else None,
        "input_disk_mb": round(used_mb, 1),
        "log_tail": text.splitlines()[-5:],
        "samples": samples[::max(1, len(samples) // 200)],
    }


def _child(input_tb: float, files: int, task_ms: float, max_tasks: int,
           memory_gb: float) -> dict[str, Any]:
    """One point in a fresh process, its address space capped so a point that does not scale
    fails alone instead of taking the machine's memory."""
    cmd = [sys.executable, __file__, "--input-tb", str(input_tb), "--files", str(files),
           "--task-ms", str(task_ms), "--max-tasks", str(max_tasks), "--json",
           "--memory-gb", str(memory_gb)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"input_tb": input_tb, "files": files, "failed": tail[-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [p for p in points if "failed" not in p]
    labels = [f"{p['input_tb']:g} TB\n{p['files']:,} files" for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    x = range(len(points))
    for key, name in (("driver_peak_rss_mb", "driver"), ("scheduler_peak_rss_mb", "scheduler")):
        axes[0].plot([i for i, p in enumerate(points) if "failed" not in p],
                     [p[key] for p in ok], marker="o", label=name)
    axes[0].axhline(1024, color="grey", ls="--", label="target 1 GB")
    axes[0].set_ylabel("peak RSS (MB)")
    axes[0].legend()
    axes[1].bar([i for i, p in enumerate(points) if "failed" not in p],
                [p["first_task_s"] for p in ok], label="first task")
    axes[1].plot([i for i, p in enumerate(points) if "failed" not in p],
                 [p["resume_planning_s"] for p in ok], "ko-", label="resume planning")
    cpu = [(i, p) for i, p in enumerate(points) if "first_task_cpu_s" in p]
    if cpu:  # wall times on a loaded machine; the driver's CPU seconds are the idle figure
        axes[1].plot([i for i, _ in cpu], [p["first_task_cpu_s"] for _, p in cpu], "rx",
                     ms=9, label="first task, driver CPU")
        axes[1].plot([i for i, _ in cpu], [p["resume_planning_cpu_s"] for _, p in cpu], "r+",
                     ms=11, label="resume planning, driver CPU")
        axes[1].legend()
    axes[1].set_ylabel("seconds")
    axes[1].legend()
    axes[2].bar([i for i, p in enumerate(points) if "failed" not in p],
                [p["max_live_tasks"] for p in ok])
    axes[2].set_ylabel("most live tasks")
    for ax in axes:
        ax.set_xticks(list(x), labels, fontsize=7)
    for i, p in enumerate(points):
        if "failed" in p:
            axes[0].annotate("failed", (i, 0), color="red")
    fig.suptitle("pipeline driver and scheduler vs input size (stand-in tasks, 2 workers)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input-tb", type=float, help="one point: input size in TB")
    ap.add_argument("--files", type=int, help="one point: number of input files")
    ap.add_argument("--task-ms", type=float, default=20.0,
                    help="duration of each stand-in task (default: %(default)s)")
    ap.add_argument("--max-tasks", type=int, default=3000,
                    help="stand-in tasks run per point (default: %(default)s)")
    ap.add_argument("--memory-gb", type=float, default=8.0,
                    help="address-space cap of each point's process (default: %(default)s)")
    ap.add_argument("--max-files", type=int, default=10_000_000,
                    help="sweep: skip points with more files (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="one point: print one JSON object")
    ap.add_argument("--sparse-run", action="store_true",
                    help="the real job on sparse files (module docstring)")
    ap.add_argument("--sparse-files", type=int, default=2000, help="(default: %(default)s)")
    ap.add_argument("--sparse-gib", type=float, default=1.0, help="(default: %(default)s)")
    ap.add_argument("--sparse-partition-bytes", type=int, default=16 << 20,
                    help="as the issue's run, 128 k partitions (default: %(default)s)")
    ap.add_argument("--sparse-partitions", type=int, default=1000,
                    help="stop once this many partitions are done (default: %(default)s)")
    ap.add_argument("--sparse-budget-s", type=float, default=600.0,
                    help="or after this long (default: %(default)s)")
    args = ap.parse_args()
    if args.sparse_run:
        point = sparse_run(args.sparse_files, args.sparse_gib, args.sparse_partition_bytes,
                           args.sparse_partitions, args.sparse_budget_s)
        path = write_results("pipeline_scale_sparse", point)
        print(json.dumps({k: v for k, v in point.items() if k != "samples"}, indent=1))
        print(f"wrote {path}")
        return
    if args.input_tb is not None and args.files is not None:
        if args.memory_gb:
            cap = int(args.memory_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        point = measure(args.input_tb, args.files, args.task_ms, args.max_tasks)
        print(json.dumps(point) if args.json else json.dumps(point, indent=1))
        return
    points = []
    for tb, files in SWEEP:
        if files > args.max_files:
            continue
        point = _child(tb, files, args.task_ms, args.max_tasks, args.memory_gb)
        points.append(point)
        print(json.dumps(point), flush=True)
    base = points[0]
    for p in points[1:]:
        if "failed" not in p and "failed" not in base:
            p["driver_vs_first"] = round(p["driver_peak_rss_mb"] / base["driver_peak_rss_mb"], 2)
            p["scheduler_vs_first"] = round(p["scheduler_peak_rss_mb"]
                                            / base["scheduler_peak_rss_mb"], 2)
    path = write_results("pipeline_scale", {"points": points, "task_ms": args.task_ms,
                                            "max_tasks": args.max_tasks})
    plot(points, RESULTS / "pipeline_scale.png")
    print(f"wrote {path} and {RESULTS / 'pipeline_scale.png'}")


if __name__ == "__main__":
    main()
