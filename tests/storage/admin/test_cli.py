"""``python -m storage`` as users meet it: inspect, gc, and --storage-options from a file or
the environment, so secrets stay out of the process list."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.config import STORAGE_OPTIONS_ENV, OptionsError, json_object, parse
from storage import ReplicaSet, commit
from storage.admin.cli import app
from storage.io.listing import list_tree
from storage.io.replicas.flags import ReplicaFlags
from tests.storage.admin.test_versions import write_version

REPO = Path(__file__).resolve().parents[3]
SECRET = "hunter2-" + "x" * 24


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != STORAGE_OPTIONS_ENV}
    return subprocess.run([sys.executable, "-m", "storage", *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env={**base, **(env or {})})


def _options(*argv: str) -> dict[str, object]:
    """The storage options ``python -m storage ARGV`` would use."""
    _, bound = parse(app, list(argv))
    return bound.arguments.get("where", ReplicaFlags()).options


def _two_versions(store: ReplicaSet) -> None:
    commit(store, write_version(store, [b"first", b"kept"]))
    commit(store, write_version(store, [b"second", b"kept"], tok=b'{"tok": 2}'))


# -- --storage-options ------------------------------------------------------------------------

def test_storage_options_inline_from_a_file_or_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = {"key": "k", "secret": SECRET, "client_kwargs": {"endpoint_url": "http://x"}}
    f = tmp_path / "opts.json"
    f.write_text(json.dumps(opts))
    assert json_object(json.dumps(opts)) == opts
    assert json_object(f"@{f}") == opts
    monkeypatch.delenv(STORAGE_OPTIONS_ENV, raising=False)
    assert _options("verify", "x") == {}
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, f"@{f}")
    assert _options("verify", "x") == opts
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, json.dumps({"anon": True}))
    assert _options("verify", "x") == {"anon": True}
    # the flag wins over the environment
    assert _options("verify", "x", "--storage-options", f"@{f}") == opts


@pytest.mark.parametrize("content, message", [
    (None, "file {f}: cannot read (No such file"),
    (f'["key", "{SECRET}"]', "file {f} must be a JSON object"),
    (f'{{"secret": "{SECRET}",}}', "file {f} is not valid JSON"),
    ("null", "file {f} must be a JSON object"),
])
def test_a_bad_options_file_is_named_and_its_content_never_shown(
        tmp_path: Path, content: str | None, message: str) -> None:
    f = tmp_path / "opts.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(OptionsError) as caught:
        json_object(f"@{f}")
    assert message.format(f=f) in str(caught.value)
    assert SECRET not in str(caught.value)
    out = _cli("verify", str(tmp_path), "--storage-options", f"@{f}")
    assert out.returncode == 2
    assert message.format(f=f) in out.stderr and "--storage-options" in out.stderr
    assert SECRET not in out.stdout + out.stderr and "Traceback" not in out.stderr


def test_bad_inline_options_never_echo_the_secret(tmp_path: Path) -> None:
    out = _cli("verify", str(tmp_path), "--storage-options", f'{{"secret": "{SECRET}"')
    assert out.returncode == 2 and "is not valid JSON" in out.stderr
    assert SECRET not in out.stdout + out.stderr


def test_bad_options_in_the_environment_name_the_variable(tmp_path: Path) -> None:
    out = _cli("verify", str(tmp_path), env={STORAGE_OPTIONS_ENV: f'["{SECRET}"]'})
    assert out.returncode == 2
    assert f"${STORAGE_OPTIONS_ENV} must be a JSON object" in out.stderr
    assert SECRET not in out.stdout + out.stderr
    missing = tmp_path / "nope.json"
    out = _cli("verify", str(tmp_path), env={STORAGE_OPTIONS_ENV: f"@{missing}"})
    assert out.returncode == 2 and f"${STORAGE_OPTIONS_ENV} @{missing}" in out.stderr


def test_help_says_how_to_keep_secrets_out_of_the_process_list() -> None:
    for sub in ("verify", "repair", "inspect", "gc"):
        out = _cli(sub, "--help")
        assert out.returncode == 0
        text = " ".join(out.stdout.split())
        assert "@FILE" in text and STORAGE_OPTIONS_ENV in text and "/proc/PID/cmdline" in text
    text = " ".join(_cli("gc", "--help").stdout.split())
    for flag in ("--keep N", "--min-age SECONDS", "--dry-run", "never removes what a kept"):
        assert flag.lower() in text.lower()


# -- inspect and gc ---------------------------------------------------------------------------

def test_inspect_lists_versions_and_gc_removes_old_ones(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    store = ReplicaSet.from_urls([str(ds)])
    _two_versions(store)
    out = _cli("inspect", str(ds))
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == ["1", "2"]
    assert rows[1][-1] == "current" and "current" not in rows[0]
    assert all(r[2] == "2" and re.fullmatch(r"[0-9a-f]{16}", r[1]) for r in rows)
    assert time.strftime("%Y-%m-%d", time.gmtime()) in out.stdout

    fresh = _cli("gc", str(ds), "--keep", "1")  # default grace: everything is too young
    assert fresh.returncode == 0 and "removed 0 version record(s), 0 object(s)" in fresh.stdout
    before = set(list_tree(store.primary))
    dry = _cli("gc", str(ds), "--keep", "1", "--min-age", "0", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove 1 version record(s), 2 object(s)" in dry.stdout
    assert set(list_tree(store.primary)) == before
    done = _cli("gc", str(ds), "--keep", "1", "--min-age", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.replace("would remove", "removed") == dry.stdout.replace(
        "would remove", "removed")
    assert "shards/part-00000-" in done.stdout and "tokenizer-" in done.stdout
    assert _cli("verify", str(ds)).returncode == 0
    again = _cli("gc", str(ds), "--keep", "1", "--min-age", "0", "-q")
    assert "removed 0 version record(s), 0 object(s), 0 work file(s): 0 in all, 0 bytes" \
        in again.stdout
    rows = _cli("inspect", str(ds)).stdout.splitlines()[1:]
    assert len(rows) == 1 and rows[0].split()[0] == "2"


def test_gc_and_inspect_errors_are_one_line(tmp_path: Path) -> None:
    out = _cli("gc", str(tmp_path), "--keep", "0")
    assert out.returncode == 2 and "--keep must be >= 1" in out.stderr
    (tmp_path / "manifest.json").write_text("null")
    out = _cli("gc", str(tmp_path), "--keep", "1", "--min-age", "0")
    assert out.returncode == 2 and "removes nothing" in out.stderr
    assert "Traceback" not in out.stderr


def test_gc_on_s3_with_options_from_a_file(s3_bucket, tmp_path: Path) -> None:  # noqa: ANN001
    url = f"{s3_bucket.url}/datasets/ds"
    store = ReplicaSet.from_urls([url], s3_bucket.storage_options)
    _two_versions(store)
    opts = tmp_path / "s3.json"
    opts.write_text(json.dumps(s3_bucket.storage_options))
    secret = s3_bucket.storage_options["secret"]
    out = _cli("inspect", url, "--storage-options", f"@{opts}")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 3 and out.stdout.rstrip().endswith("current")
    out = _cli("gc", url, "--keep", "1", "--min-age", "0",
               env={STORAGE_OPTIONS_ENV: f"@{opts}"})
    assert out.returncode == 0, out.stderr
    assert "removed 1 version record(s), 2 object(s)" in out.stdout
    assert secret not in out.stdout + out.stderr
    assert _cli("verify", url, "--storage-options", f"@{opts}").returncode == 0


# -- the shared configuration mechanism (infra/config.py) ---------------------------------

@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["gc", "x"], ["gc", "x", "--keep", "two"],
                                  ["gc", "x", "--keep", "1", "--no-dry-run"],
                                  ["verify", "x", "--wait"], ["verify", "x", "--no-such-flag"]])
def test_usage_errors_are_one_line_with_rc_2(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from storage.admin.cli import main

    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def test_gc_flags_from_a_config_file_and_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for suffix, text in ((".toml", 'keep = 2\nmin-age = 5\nquiet = true\nreplica = ["r2"]\n'),
                         (".yaml", "keep: 2\nmin_age: 5\nquiet: true\nreplica: [r2]\n"),
                         (".json", '{"keep": 2, "min-age": 5, "quiet": true, "replica": ["r2"]}')):
        path = tmp_path / f"gc{suffix}"
        path.write_text(text)
        monkeypatch.setenv("SHARDFLOW_STORAGE_MIN_AGE", "7")
        monkeypatch.setenv("SHARDFLOW_STORAGE_KEEP", "9")
        _, bound = parse(app, ["gc", "x"])
        assert (bound.arguments["keep"], bound.arguments["min_age"]) == (9, 7.0)
        _, bound = parse(app, ["gc", "x", "--config", str(path)])
        got = bound.arguments
        assert (got["keep"], got["min_age"], got["quiet"]) == (2, 5.0, True)
        assert got["where"].replica == ["r2"]
        _, bound = parse(app, ["gc", "x", "--config", str(path), "--keep", "3"])
        assert bound.arguments["keep"] == 3
