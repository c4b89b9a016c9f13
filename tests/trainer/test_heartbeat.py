"""The heartbeat's rule (pure, property-tested) and its threads over a real in-process c10d
store: who is blamed for a hang, when, and what every rank does then."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trainer.conftest import REPO
from trainer.distributed import DEFAULT_PG_TIMEOUT_S, nccl_env, pg_timeout_s
from trainer.heartbeat import (
    HANG_EXIT_CODE,
    IO_PHASES,
    PHASE_ORDER,
    Beat,
    Heartbeat,
    Seen,
    Verdict,
    judge,
    limit_for,
)

PHASES = sorted(p for p in PHASE_ORDER if p != "done")
T, T_IO = 10.0, 100.0


def seen(rank: int, phase: str, step: int, idle: float, silent: bool, now: float) -> Seen:
    return Seen(Beat(rank, 1, 1, phase, step, "h", 100 + rank), now - idle,
                now - (1000.0 if silent else 0.0))


ranks = st.lists(st.tuples(st.sampled_from(PHASES), st.integers(0, 5),
                           st.floats(0, 300), st.booleans()), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(ranks)
def test_blames_the_rank_furthest_behind_once_past_its_phase_limit(rs: list) -> None:
    now = 1000.0
    obs = {r: seen(r, ph, step, idle, silent, now) for r, (ph, step, idle, silent) in
           enumerate(rs)}
    v = judge(obs, now, T, T_IO, silent_after=3.0)
    behind = min((step, PHASE_ORDER[ph]) for ph, step, _, _ in rs)
    candidates = [r for r, (ph, step, _, _) in enumerate(rs)
                  if (step, PHASE_ORDER[ph]) == behind]
    if v is None:
        # the rank blamed (among those behind: a silent one first, then the longest idle) is
        # within its phase's limit
        silent = [r for r in candidates if rs[r][3]] or candidates
        pick = max(silent, key=lambda r: rs[r][2])
        assert rs[pick][2] <= limit_for(rs[pick][0], T, T_IO)
        return
    assert v.rank in candidates  # never a rank that is ahead (it waits for the one behind)
    ph, step, idle, silent = rs[v.rank]
    assert (v.phase, v.step, v.silent) == (ph, step, silent)
    assert idle > limit_for(ph, T, T_IO)
    if any(rs[r][3] for r in candidates):
        assert silent  # a frozen process is blamed before a live one waiting beside it


@given(st.sampled_from(sorted(IO_PHASES)), st.floats(T + 0.01, T_IO))
def test_no_false_alarm_while_saving_loading_or_in_the_first_step(phase: str,
                                                                  idle: float) -> None:
    now = 1000.0
    # rank 0 in a long save/load; rank 1 already in the next step, blocked: also idle, ahead
    obs = {0: seen(0, phase, 5, idle, False, now), 1: seen(1, "step", 6, idle, False, now)}
    assert judge(obs, now, T, T_IO, silent_after=3.0) is None


def test_a_stopped_rank_is_named_after_the_timeout_not_before() -> None:
    now = 1000.0
    obs = {0: seen(0, "step", 7, T + 1, False, now), 1: seen(1, "step", 7, T + 1, True, now),
           2: seen(2, "done", 9, 500, True, now)}
    v = judge(obs, now, T, T_IO, silent_after=3.0)
    assert v is not None and (v.rank, v.silent, v.pid) == (1, True, 101)
    assert "rank 1 on host h (pid 101)" in v.message() and "'step' at step 7" in v.message()
    obs = {r: Seen(s.beat, now - T + 0.5, s.tick_at) for r, s in obs.items()}
    assert judge(obs, now, T, T_IO, silent_after=3.0) is None


def test_timeouts_of_the_process_group_and_nccl() -> None:
    assert pg_timeout_s(0, 600) == DEFAULT_PG_TIMEOUT_S  # off: torch's gloo default, stated
    assert pg_timeout_s(60, 600) == 720  # never before the heartbeat would have fired
    env = nccl_env(720)
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "780"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


class Rank:
    """A Heartbeat over a shared store, exiting into a list instead of the process."""

    def __init__(self, store: dist.Store, rank: int, world: int, lines: list[str]) -> None:
        self.exits: list[int] = []
        self.hb = Heartbeat(store, rank, world, timeout=1.0, timeout_io=30.0,
                            exit_fn=self.exits.append, log=lines.append)


def wait(pred, timeout: float = 15) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_a_stuck_training_thread_is_named_dumps_its_own_stack_and_all_exit(capfd) -> None:  # noqa: ANN001
    """Rank 1's loop stops beating while its sidecar runs (a stuck read): after the first
    step's longer limit is over, rank 0 keeps making progress, rank 1 does not; a
    watcher names it, rank 1 dumps its own stack, every rank exits 75."""
    store, lines = dist.HashStore(), []
    r0, r1 = Rank(store, 0, 2, lines), Rank(store, 1, 2, lines)
    for r in (r0, r1):
        r.hb.start()
        r.hb.beat("data", 2)
    started = time.monotonic()
    try:
        while not r0.exits and time.monotonic() - started < 15:
            r0.hb.beat("step", 3)  # rank 0 moves (it could not for long in a real job)
            time.sleep(0.05)
        wait(lambda: r0.exits and r1.exits)
    finally:
        for r in (r0, r1):
            r.hb._stop.set()
    took = time.monotonic() - started
    assert r0.exits == r1.exits == [HANG_EXIT_CODE]
    assert 1.0 <= took < 14, took  # the 1 s limit, then a watcher's poll: a stall bound
    v = Verdict.loads(store.get("verdict"))
    assert (v.rank, v.phase, v.step, v.silent) == (1, "data", 2, False) and v.by in (0, 1)
    assert [ln for ln in lines if "made no progress" in ln] == [v.message()]
    err = capfd.readouterr().err
    assert "most recent call first" in err and "test_heartbeat.py" in err


def test_no_alarm_in_a_long_save_and_done_ranks_are_left_out() -> None:
    store, lines = dist.HashStore(), []
    r0, r1 = Rank(store, 0, 2, lines), Rank(store, 1, 2, lines)
    for r in (r0, r1):
        r.hb.start()
    r0.hb.beat("save", 4)  # longer than --hang-timeout, within --hang-timeout-io
    r1.hb.beat("step", 5)
    time.sleep(2.5)
    r1.hb.stop()
    r0.hb.beat("finish")
    time.sleep(1.5)  # rank 1 done, silent: never a hang
    r0.hb.stop()
    assert (r0.exits, r1.exits, lines) == ([], [], [])
    assert not store.check(["verdict"])


# A rank in its own process, over a real TCPStore: a busy thread moves its frames all the
# time (dataclasses.asdict, where a CI run's C-handler dump broke off and the rank died of
# SIGSEGV); ``hold`` then either waits (to be SIGSTOPped from outside) or holds the GIL in one
# long C call (a catastrophic regex), frozen without being stopped.
CHILD = r"""
import dataclasses, datetime, re, sys, threading, time
import torch.distributed as dist
from trainer.heartbeat import Heartbeat

@dataclasses.dataclass
class Deep:
    items: list

def churn():
    value = Deep([Deep([Deep(list(range(20)))] * 5)] * 5)
    while True:
        dataclasses.asdict(value)

store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, False,
                      timeout=datetime.timedelta(seconds=30))
hb = Heartbeat(store, 1, 2, timeout=1.0, timeout_io=30.0, watch=False).start()
hb.beat("data", 2)
threading.Thread(target=churn, daemon=True).start()
print("ready", flush=True)
if sys.argv[2] == "gil":
    re.match(r"(a+)+$", "a" * 60 + "b")  # holds the GIL for hours
time.sleep(3600)
"""


def _watched_child(tmp_path: Path, mode: str) -> tuple[dist.Store, subprocess.Popen, Path]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 2, True, wait_for_workers=False)
    script = tmp_path / "rank1.py"
    script.write_text(CHILD)
    err = (tmp_path / "rank1.err").open("w")
    child = subprocess.Popen([sys.executable, str(script), str(port), mode], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=err, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.stdout.readline().strip() == "ready"
    return store, child, tmp_path / "rank1.err"


def _watch_until_exit(store: dist.Store, lines: list[str]) -> Rank:
    switch = sys.getswitchinterval()  # the watcher raises it to hold the GIL, then exits
    r0 = Rank(store, 0, 2, lines)
    try:
        r0.hb.start()
        end = time.monotonic() + 20
        while not r0.exits and time.monotonic() < end:
            r0.hb.beat("step", 3)
            time.sleep(0.05)
        wait(lambda: r0.exits)
    finally:
        r0.hb._stop.set()
        sys.setswitchinterval(switch)
    return r0


def test_a_stopped_rank_is_continued_and_dumps_its_own_stack_whole(tmp_path: Path) -> None:
    """SIGSTOPped with a thread busy in Python: the watcher names it silent, sends only
    SIGCONT; its sidecar dumps every thread's stack from Python (the busy thread's frames
    included, whole) and it exits 75: never killed by a signal mid-dump."""
    store, child, err = _watched_child(tmp_path, "stop")
    try:
        time.sleep(0.3)
        child.send_signal(signal.SIGSTOP)
        lines: list[str] = []
        r0 = _watch_until_exit(store, lines)
        assert child.wait(10) == HANG_EXIT_CODE
    finally:
        child.kill()
    v = Verdict.loads(store.get("verdict"))
    assert (v.rank, v.silent, v.signalled, v.pid) == (1, True, False, child.pid)
    assert r0.exits == [HANG_EXIT_CODE]
    assert any("is stopped (SIGSTOP or a debugger)" in ln for ln in lines), lines
    text = err.read_text()
    assert f"trainer: hang: stack of rank 1 (pid {child.pid}):" in text, text
    # the busy thread's stack, whole: from wherever the dump caught it (inside asdict's
    # recursion most of the time, sometimes between two calls, in churn itself) down to the
    # thread's bootstrap, with no frame unreadable
    busy = [block for block in text.split("\n\n") if "in churn" in block]
    assert len(busy) == 1 and "in _bootstrap_inner" in busy[0] and "???" not in text, text
    frames = [ln for ln in busy[0].splitlines() if ln.startswith("  ")]
    assert frames and all(re.fullmatch(r'  File ".+", line \d+ in \S+', ln) for ln in frames), text
    assert "in <module>" in text, text  # the main thread's frame, after the busy one's


def test_a_rank_frozen_in_a_c_call_is_dumped_by_sigusr1(tmp_path: Path) -> None:
    """Frozen but not stopped (its GIL held in one long C call): its sidecar cannot run, so
    the watcher sends SIGUSR1 and its faulthandler dumps the stacks in C."""
    store, child, err = _watched_child(tmp_path, "gil")
    try:
        lines: list[str] = []
        r0 = _watch_until_exit(store, lines)
        v = Verdict.loads(store.get("verdict"))
        assert (v.rank, v.silent, v.signalled, v.pid) == (1, True, True, child.pid)
        assert r0.exits == [HANG_EXIT_CODE]
        wait(lambda: "in <module>" in err.read_text(), 10)
        assert child.poll() is None  # still frozen: the job's teardown is torchrun's
    finally:
        child.kill()
        child.wait()
    text = err.read_text()
    assert "most recent call first" in text and "in match" in text, text  # the C call
    assert not any("is stopped" in ln for ln in lines), lines
