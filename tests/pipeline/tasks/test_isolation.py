"""Records in isolation (pipeline.tasks.isolation): the child process gives what the worker gives,
and a record that ends it (its CPU limit, its wall limit, its memory limit, a crash) is named
poison while the records after it go on in a fresh child. Real processes and real signals
throughout; the scheduler's count of lost attempts is read from a real LocalCluster whose
worker is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pipeline.cleaning import CleaningConfig
from pipeline.config import PipelineConfig
from pipeline.records import Document
from pipeline.steps.contract import StepError
from pipeline.steps.recipe import Recipe, spec
from pipeline.steps.shorthand import recipe_of
from pipeline.tasks.isolation import IsolatedSteps, lost_attempts, steps_for
from pipeline.tasks.record_steps import (
    TOO_COMPLEX,
    Poisoned,
    RecordLimits,
    RecordSteps,
)
from pipeline.web import WebConfig
from tests.pipeline._procs import ENV, REPO, dask_cluster
from tests.pipeline.web import warcs

WEB = recipe_of(CleaningConfig(), WebConfig(filters=("gopher_repetition",), identify=True,
                                            pii=True, metadata=True))
PLAIN = recipe_of(CleaningConfig())
#: ~2-3 s of extraction, admitted by the complexity check (300,000 <p> 123 deep)
SLOW = ("<html><body>" + "<div>" * 120 + "<p>t</p>" * 300_000 + "</div>" * 120
        + "</body></html>")


def _docs() -> list[Document]:
    pages = [Document(f"page{i}", html.decode("utf-8", "replace"), url=url,
                      date="2024-05-01T12:00:00Z", source=f"a.warc.gz@{1000 * i}", kind="html")
             for i, (url, html) in enumerate(warcs.debian_pages(10, min_bytes=3000))]
    text = Document("wet", "Contact admin@corp.com about server 8.8.4.1 today. " * 20,
                    url="https://wet.example/", source="c.wet.gz@0")
    other = Document("pdf", "", url="https://pdf.example/", source="a.warc.gz@9",
                     kind="other:application/pdf")
    deep = Document("deep", "<div>" * 100_000, url="https://deep.example/",
                    source="a.warc.gz@99", kind="html")
    return [*pages[:5], text, deep, other, *pages[5:]]


def _run(steps: RecordSteps | IsolatedSteps, docs: list[Document]) -> list[str | None]:
    out: list[str | None] = []
    for doc in docs:
        try:
            text = steps(doc)
        except Poisoned as bad:
            out.append(f"poisoned: {bad.reason}: {bad.detail}")
            continue
        if text is not None:
            steps.keep()
        out.append(text)
    return out


def test_isolation_gives_what_the_worker_gives() -> None:
    """Texts, drop and change counts, metadata columns and the complexity check's refusal:
    the same from the child as from this process."""
    docs = _docs()
    here = RecordSteps(WEB)
    isolated = IsolatedSteps(WEB, None, RecordLimits())
    try:
        expected = _run(here, docs)
        assert _run(isolated, docs) == expected
        assert isolated.dropped == here.dropped and isolated.changed == here.changed
        assert isolated.take() == here.take()
        assert isolated.poisoned == 0  # the refused page is not a lost child
    finally:
        isolated.close()
    assert sum(t is not None and not t.startswith("poisoned") for t in expected) >= 9
    assert f"poisoned: {TOO_COMPLEX}: elements nested more than 512 deep" in expected
    assert here.dropped["not_html"] == 1 and here.changed["pii_emails_masked"] >= 1


def _around_poison(limits: RecordLimits, poison: Document,
                   during: threading.Timer | None = None) -> Poisoned:
    """The poison record between two good ones: the good ones give their texts (the second
    from a fresh child) and count as if the poison were not there."""
    good = _docs()[:2]
    isolated = IsolatedSteps(WEB, None, limits)
    here = RecordSteps(WEB)
    try:
        first = isolated(good[0])
        pid = isolated._child.proc.pid  # type: ignore[union-attr]
        if during is not None:
            during.args = [pid]
            during.start()
        with pytest.raises(Poisoned) as caught:
            isolated(poison)
        assert isolated._child is None and isolated.poisoned == 1
        assert not os.path.exists(f"/proc/{pid}") or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        second = isolated(good[1])
        assert [first, second] == [here(good[0]), here(good[1])]
        assert isolated.dropped == here.dropped and isolated.changed == here.changed
    finally:
        isolated.close()
        if during is not None:
            during.cancel()
    return caught.value


def _slow() -> Document:
    return Document("slow", SLOW, url="https://slow.example/", source="a.warc.gz@5000",
                    kind="html")


def test_a_record_past_the_cpu_limit_is_poison() -> None:
    bad = _around_poison(RecordLimits(cpu_s=0.5), _slow())
    assert (bad.reason, bad.detail) == ("record_cpu_limit", "its steps ran past 0.5 s of CPU time")


def test_a_record_past_the_wall_limit_is_poison() -> None:
    bad = _around_poison(RecordLimits(wall_s=0.5), _slow())
    assert (bad.reason, bad.detail) == ("record_time_limit", "its steps ran past 0.5 s")


def test_a_record_past_the_memory_limit_is_poison() -> None:
    """8 MB of paragraphs: ~700 MB in the parser, against a child of ~120 MB."""
    big = Document("big", "<html><body>" + "<p>t</p>" * 1_000_000, source="a.warc.gz@7",
                   kind="html")
    bad = _around_poison(RecordLimits(memory_bytes=300 << 20), big)
    assert bad.reason == "record_memory_limit"
    assert bad.detail.endswith(f"more than {300 << 20:,}")


def test_a_record_that_crashes_its_process_is_poison() -> None:
    """The child dies of SIGSEGV while it extracts (sent by a timer: the same death a fault in
    a C extension gives)."""
    crash = threading.Timer(0.5, lambda pid: os.kill(pid, signal.SIGSEGV))
    bad = _around_poison(RecordLimits(), _slow(), crash)
    assert (bad.reason, bad.detail) == ("record_crashed",
                                        "the process running its steps died of SIGSEGV")


class _Raises:
    """A user step that raises on one document and breaks the contract on another."""

    name = "odd"
    version = "1"

    def __call__(self, doc: Any) -> Any:
        if doc.text.startswith("raise"):
            raise ValueError("no such thing")
        if doc.text.startswith("garbage"):
            return 42
        return doc


_ODD = Recipe((*PLAIN.steps, spec("tests.pipeline.tasks.test_isolation:_Raises", "odd")))


def test_a_step_that_raises_poisons_its_record_alike_here_and_in_isolation() -> None:
    """A step's exception quarantines its record (reason ``<step>.error``), in isolation as
    in the worker; the child lives on (not a lost child)."""
    isolated = IsolatedSteps(_ODD, None, RecordLimits())
    here = RecordSteps(_ODD)
    try:
        for steps in (here, isolated):
            with pytest.raises(Poisoned) as caught:
                steps(Document("bad", "raise it", kind="text"))
            assert (caught.value.reason, caught.value.detail) == \
                ("odd.error", "ValueError: no such thing")
            assert steps(Document("ok", "A plain sentence.")) == "A plain sentence."
        assert isolated.poisoned == 0
    finally:
        isolated.close()


def test_a_step_that_breaks_the_contract_fails_the_task_as_in_the_worker() -> None:
    """Not a poison record: a bug in the step, said once with its name (the task fails)."""
    garbage = Document("g", "garbage in", kind="text")
    with pytest.raises(StepError, match="step 'odd' returned int"):
        RecordSteps(_ODD)(garbage)
    isolated = IsolatedSteps(_ODD, None, RecordLimits())
    try:
        with pytest.raises(RuntimeError, match="in isolation: StepError: step 'odd' returned"):
            isolated(garbage)
        assert isolated(Document("ok", "A plain sentence of text.")) == \
            "A plain sentence of text."
    finally:
        isolated.close()


@pytest.mark.parametrize("disarm", [False, True])
def test_the_cpu_guard_ends_its_process_unless_disarmed(disarm: bool) -> None:
    code = ("import time\nfrom pipeline.tasks.record_steps import CpuGuard\n"
            "guard = CpuGuard(0.3)\nassert guard.on\nguard.arm()\n"
            f"{'guard.disarm()' if disarm else ''}\n"
            "end = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, timeout=60)
    assert done.returncode == (0 if disarm else -signal.SIGPROF)


def test_outside_a_worker_nothing_is_armed_or_isolated() -> None:
    steps = steps_for(PLAIN, None, RecordLimits(cpu_s=0.01))
    assert isinstance(steps, RecordSteps) and not steps.guard.on
    assert lost_attempts() == 0


def test_limits_are_config_fields_checked_and_recorded_when_changed() -> None:
    """``--record-cpu-s`` / ``--record-wall-s`` (or ``SHARDFLOW_PIPELINE_RECORD_CPU_S``):
    positive finite seconds, in the manifest when not the default (they decide which
    records are poison, so a rerun with another limit is another build)."""
    assert "record_cpu_s" not in PipelineConfig().for_manifest()
    changed = PipelineConfig(record_cpu_s=2.5, record_wall_s=9).for_manifest()
    assert changed["record_cpu_s"] == 2.5 and changed["record_wall_s"] == 9
    for bad in (0, -1, float("nan"), float("inf"), 10**9):
        with pytest.raises(ValueError, match=r"--record-cpu-s must be a finite number"):
            PipelineConfig(record_cpu_s=bad)
        with pytest.raises(ValueError, match=r"--record-wall-s must be a finite number"):
            PipelineConfig(record_wall_s=bad)


# -- the scheduler's count, on a real cluster --------------------------------------------------

def _dies_once(marker: str) -> int:
    """Kills its worker the first time it runs (a real SIGKILL), then says what it sees."""
    if not os.path.exists(marker):
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return lost_attempts()


def _fails_once(marker: str) -> int:
    """Raises the first time (Dask retries it: an error, not a lost worker)."""
    if not os.path.exists(marker):
        Path(marker).touch()
        raise RuntimeError("once")
    return lost_attempts()


@pytest.mark.slow
def test_a_task_knows_it_was_lost_with_a_worker(tmp_path: Path) -> None:
    from pipeline.driver.cluster import dask_client

    with dask_client(1, dashboard_address="127.0.0.1:0") as client:
        assert client.submit(lost_attempts, pure=False).result(timeout=60) == 0
        assert client.submit(_fails_once, str(tmp_path / "f"), retries=1,
                             pure=False).result(timeout=60) == 0
        assert client.submit(_dies_once, str(tmp_path / "d"),
                             pure=False).result(timeout=120) == 1


@pytest.mark.slow
def test_a_task_knows_it_was_lost_on_a_separate_cluster(tmp_path: Path) -> None:
    """A ``dask scheduler`` process without a nanny behind its workers: the question goes to
    that scheduler as a closure (it needs no Shardflow code), and the task that killed one
    worker learns it on the other."""
    from distributed import Client

    with dask_cluster(tmp_path / "cluster", workers=2) as cluster, \
            Client(cluster.address) as client:
        assert client.submit(_dies_once, str(tmp_path / "d"),
                             pure=False).result(timeout=120) == 1
