"""Hostile values and files given to the shared configuration mechanism (infra/config.py)
of all three commands: a FIFO or /dev/zero as ``--config`` or ``@FILE``, a TOML date in an
options table, NaN and infinite numbers, arbitrary bytes. Each is one ``error:`` line and exit
code 2, at once: never a hang, a traceback or the memory of a whole device."""

from __future__ import annotations

import contextlib
import io
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import OptionsError, json_object, parse
from storage.io.replicas.config import load_replica_config

REPO = Path(__file__).resolve().parents[2]
#: what each command needs besides the flag under test to get as far as reading it
COMMANDS = {"pipeline": ["pipeline", "run"], "storage": ["storage", "gc", "--keep", "1"],
            "trainer": ["trainer", "--data", "nowhere"]}
#: the child's address space: the code before read /dev/zero until MemoryError (17.9 GB for
#: --inputs-from); capped, it fails fast instead of taking the test machine's memory
MEMORY_CAP = 3 << 30


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _cli(command: str, *args: str, env: dict[str, str] | None = None,
         timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", *COMMANDS[command], *args], cwd=REPO,
                         capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})}, preexec_fn=_cap_memory)
    return out, time.monotonic() - start


def _one_error_line(out: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr[-2000:]
    for part in parts:
        assert part in out.stderr, (part, out.stderr)


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    path = str(tmp_path / "fifo.toml")
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_fifo_as_config_is_an_error_at_once_in_every_command(command: str, fifo: str) -> None:
    """The code before opened it and waited for a writer forever, without a word."""
    out, _ = _cli(command, "--config", fifo, timeout=60)
    _one_error_line(out, fifo, "is a FIFO (named pipe), not a regular file")


@pytest.mark.parametrize("args", [["--config", "/dev/zero"],
                                  ["--storage-options", "@/dev/zero"]])
def test_dev_zero_as_config_or_options_file_is_refused_unread(args: list[str]) -> None:
    """The code before read it to a MemoryError (here: under a 3 GB cap)."""
    out, took = _cli("pipeline", *args)
    _one_error_line(out, "/dev/zero", "is a character device, not a regular file")


def test_options_file_named_by_the_environment_may_not_be_a_fifo(fifo: str) -> None:
    out, _ = _cli("storage", "/tmp/nowhere", env={"SHARDFLOW_STORAGE_OPTIONS": f"@{fifo}"})
    _one_error_line(out, "$SHARDFLOW_STORAGE_OPTIONS @" + fifo, "FIFO")


def test_a_big_config_file_is_refused_naming_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:
        fh.truncate(64 << 20)  # sparse: 64 MiB of zeros
    out, _ = _cli("pipeline", "--config", str(path))
    _one_error_line(out, str(path), "longer than 16,777,216 bytes")


@pytest.mark.parametrize("text, key", [
    ("[storage_options]\nwhen = 1979-05-27T07:32:00Z\n", "a datetime value"),
    ("storage_options = { a = { b = 07:32:00 } }\n", "a time value"),
    ("[storage_options]\nday = 1979-05-27\n", "a date value")])
def test_a_toml_date_in_storage_options_is_an_error_naming_the_key(
        tmp_path: Path, text: str, key: str) -> None:
    """The code before: TypeError: Object of type datetime is not JSON serializable."""
    path = tmp_path / "c.toml"
    path.write_text(text)
    for command in sorted(COMMANDS):
        out, _ = _cli(command, "--config", str(path))
        _one_error_line(out, f"--config {path}: storage_options: {key} is not accepted")


@pytest.mark.parametrize("command, args, env, flag", [
    ("pipeline", ["--lease-ttl", "nan"], {}, "--lease-ttl"),
    ("pipeline", ["--grid-intensity", "inf"], {}, "--grid-intensity"),
    ("pipeline", [], {"SHARDFLOW_PIPELINE_MIN_ALPHA_FRAC": "nan"}, "--min-alpha-frac"),
    ("trainer", ["--hang-timeout", "inf"], {}, "--hang-timeout"),
    ("trainer", [], {"SHARDFLOW_TRAINER_LR": "nan"}, "--lr"),
    ("storage", ["x", "--min-age", "nan"], {}, "--min-age"),
    ("pipeline", ["--min-chars", "1" + "0" * 30], {}, "--min-chars"),
])
def test_nan_infinite_and_huge_numbers_are_errors_naming_the_flag(
        command: str, args: list[str], env: dict[str, str], flag: str) -> None:
    out, _ = _cli(command, *args, env=env)
    _one_error_line(out, flag)
    assert "finite" in out.stderr or "out of range" in out.stderr, out.stderr


def test_nan_from_a_config_file_is_refused_too(tmp_path: Path) -> None:
    for name, text in (("c.toml", "lease_ttl = nan\n"), ("c.json", '{"lease-ttl": NaN}'),
                       ("c.yaml", "lease_ttl: .inf\n")):
        path = tmp_path / name
        path.write_text(text)
        out, _ = _cli("pipeline", "--config", str(path))
        _one_error_line(out, "--lease-ttl", "finite")


# -- property tests: arbitrary bytes in each file surface, only clean errors ------------------

def _apps() -> dict[str, tuple[object, list[str]]]:
    from pipeline.cli import app as pipeline_app
    from storage.admin.cli import app as storage_app
    from trainer.config import app as trainer_app

    return {"pipeline": (pipeline_app, ["run"]), "storage": (storage_app, ["gc", "--keep", "1"]),
            "trainer": (trainer_app, ["--data", "x"])}


def _parses_or_one_error_line(app: object, argv: list[str]) -> None:
    """What the commands' ``main`` does first: parse; it returns, or prints one ``error:``
    line and exits 2. Anything else escaping (a traceback) fails the test."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parse(app, argv)  # type: ignore[arg-type]
        except SystemExit as exc:
            assert exc.code == 2, (exc.code, err.getvalue())
            text = err.getvalue()
            assert text.startswith("error: ") and text.count("\n") == 1, text


#: config-file-like bytes: real syntax pieces and keys, mixed with anything
_PIECES = st.sampled_from([
    b"lease_ttl = ", b"min_chars: ", b'{"storage_options": ', b"[storage_options]\n",
    b"storage_options = {", b"inputs = [", b"nan", b"inf", b"1e999", b"1979-05-27", b"07:32:00",
    b"&a [1]\n", b"*a", b"[[", b"{", b'"', b"\n", b"= ", b"- ", b"true", b"-1", b"10" * 12,
    b"deadline = ", b"lr = ", b"keep = ", b"replica = [", b"\xff", b"\x00", b"config: "])
_BYTES = st.lists(st.one_of(_PIECES, st.binary(max_size=12)), max_size=24).map(b"".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(data=_BYTES, suffix=st.sampled_from([".toml", ".yaml", ".json"]),
       command=st.sampled_from(sorted(COMMANDS)))
def test_any_bytes_as_a_config_file_parse_or_are_one_error_line(
        tmp_path: Path, data: bytes, suffix: str, command: str) -> None:
    app, argv = _apps()[command]
    path = tmp_path / f"c{suffix}"
    path.write_bytes(data)
    _parses_or_one_error_line(app, [*argv, "--config", str(path)])


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(data=_BYTES, command=st.sampled_from(sorted(COMMANDS)))
def test_any_bytes_as_an_options_file_parse_or_are_one_error_line(
        tmp_path: Path, data: bytes, command: str) -> None:
    app, argv = _apps()[command]
    path = tmp_path / "opts.json"
    path.write_bytes(data)
    _parses_or_one_error_line(app, [*argv, "--storage-options", f"@{path}"])
    try:
        assert isinstance(json_object(f"@{path}"), dict)
    except OptionsError as exc:
        assert str(path) in str(exc)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(data=_BYTES, suffix=st.sampled_from([".toml", ".json"]))
def test_any_bytes_as_a_replica_config_load_or_are_a_value_error_naming_it(
        tmp_path: Path, data: bytes, suffix: str) -> None:
    """The commands print a ValueError as one ``error:`` line with exit code 2."""
    path = tmp_path / f"replicas{suffix}"
    path.write_bytes(data)
    try:
        load_replica_config(str(path))
    except ValueError as exc:
        assert str(path) in str(exc)
