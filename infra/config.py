"""The one configuration mechanism of every command (``python -m pipeline|trainer|storage``).

Each component owns a typed dataclass (``pipeline.config.PipelineConfig``,
``trainer.config.TrainConfig``); `cyclopts <https://cyclopts.readthedocs.io>`_ turns its fields
into ``--kebab-case`` flags (``--x/--no-x`` for booleans) with the field's ``metadata["help"]``
as help, and this module adds what every command shares:

- :func:`load_config_file`: the one ``--config FILE`` loader (TOML, YAML or JSON by extension;
  keys are the flags' names, dashes or underscores; an unknown key is an error naming it);
- environment overrides ``SHARDFLOW_<COMPONENT>_<FIELD>`` (:func:`env_prefix`);
- ``--storage-options JSON|@FILE`` (:data:`StorageOptions`), defaulting to
  ``$SHARDFLOW_STORAGE_OPTIONS``, whose errors never echo a value (it may hold credentials);
- :func:`parse`: cyclopts' parse with our error convention (one ``error: ...`` line, rc 2),
  and :func:`check_numbers`: every float finite and within ``±FLOAT_LIMIT``, every int an
  int64, whichever of the places below it came from.

Files named here (``--config``, ``@FILE``) are read by :mod:`infra.user_files`: regular
files only (a FIFO or device is refused without being opened) and at most a bounded size.

Precedence, for every value: command-line flags, then the ``--config`` file, then the
environment, then the dataclass default (stated once, on the field).

It lives in ``infra`` because infra imports nothing of ours and every package may import it.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any

from cyclopts import App, Parameter, Token
from cyclopts.argument import ArgumentCollection
from cyclopts.config import Dict, Env
from cyclopts.exceptions import CycloptsError

from infra import environment
from infra.user_files import (
    CONFIG_LIMIT,
    OPTIONS_LIMIT,
    UserFileError,
    read_text,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: the default of every ``--storage-options`` flag: JSON or ``@FILE``, like the flag
STORAGE_OPTIONS_ENV = "SHARDFLOW_STORAGE_OPTIONS"

#: every environment override starts with this (``SHARDFLOW_PIPELINE_MIN_CHARS=20``)
ENV_PREFIX = "SHARDFLOW_"

#: the largest magnitude of any float a command takes (seconds, g/kWh, rates): 31 years in
#: seconds, under what ``time.sleep`` and ``threading`` waits accept (``TIMEOUT_MAX``)
FLOAT_LIMIT = 1e9
#: the largest magnitude of any int a command takes: what an int64 column or field holds
INT_LIMIT = 2**63 - 1

STORAGE_OPTIONS_HELP = (
    "fsspec options shared by all replicas, as a JSON object or @FILE (a file holding one); "
    f"default: ${STORAGE_OPTIONS_ENV}, same syntax. Secrets given inline are visible to every "
    "local user in the process list (/proc/PID/cmdline): put them in a file (@FILE), in "
    f"${STORAGE_OPTIONS_ENV}, or in AWS_* environment variables")


class OptionsError(ValueError):
    """A ``--storage-options`` value that is no JSON object; the message never holds it."""


class ConfigFileError(CycloptsError):
    """A ``--config`` file that cannot be read or names an unknown key (reported like a bad
    flag: one line, rc 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(msg=message)


class _FromEnvironment(str):
    """A default taken from ``$SHARDFLOW_STORAGE_OPTIONS`` (so errors name the variable)."""

    __slots__ = ()


def json_object(text: str) -> dict[str, Any]:
    """Options given as a JSON object, or as ``@FILE`` holding one.

    Errors name the file or variable but never echo the value: it may hold credentials.
    """
    where = f"${STORAGE_OPTIONS_ENV}" if isinstance(text, _FromEnvironment) else "value"
    if text.startswith("@"):
        path = os.path.expanduser(text[1:])
        what = f"{where} @" if isinstance(text, _FromEnvironment) else "file"
        where = f"{where} @{path}" if isinstance(text, _FromEnvironment) else f"file {path}"
        try:  # a regular file, at most OPTIONS_LIMIT bytes: never a FIFO's endless wait
            text = read_text(path, what, OPTIONS_LIMIT)
        except UserFileError as exc:
            raise OptionsError(str(exc).replace("@ ", "@", 1)) from None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = f"{exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(
            exc, json.JSONDecodeError) else "nested too deeply"
        raise OptionsError(f"{where} is not valid JSON ({reason})") from None
    if not isinstance(value, dict):
        raise OptionsError(f"{where} must be a JSON object, e.g. '{{\"anon\": false}}', not "
                           f"{type(value).__name__}")
    return value


def storage_options_default(fallback: Any = None) -> Any:
    """``$SHARDFLOW_STORAGE_OPTIONS`` when set (to be parsed by :func:`json_object`, which then
    names the variable in its errors), else ``fallback``."""
    value = environment.value(STORAGE_OPTIONS_ENV)
    return _FromEnvironment(value) if value else fallback


def _options_converter(type_: Any, tokens: Sequence[Token]) -> dict[str, Any]:
    """cyclopts converter of ``--storage-options``: :func:`json_object` on the one token,
    told when the token came from ``$SHARDFLOW_STORAGE_OPTIONS``. An :class:`OptionsError`
    (a ValueError) becomes cyclopts' "Invalid value for --storage-options: ..." line, which
    shows our message, never the token."""
    token = tokens[-1]
    text = token.value
    if token.source == "env" and token.keyword == STORAGE_OPTIONS_ENV:
        text = _FromEnvironment(text)
    return json_object(text)


#: the ``--storage-options`` flag of every command (``env_var``: cyclopts reads the variable
#: when neither the flag nor the ``--config`` file gives a value)
StorageOptions = Annotated[dict[str, Any] | None, Parameter(
    converter=_options_converter, env_var=STORAGE_OPTIONS_ENV, accepts_keys=False, n_tokens=1,
    metavar="JSON|@FILE", help=STORAGE_OPTIONS_HELP)]

#: a ``--checkpoint-storage-options``-like flag: the same syntax, no environment default
OptionsFlag = Annotated[dict[str, Any] | None, Parameter(
    converter=_options_converter, accepts_keys=False, n_tokens=1, metavar="JSON|@FILE")]


# -- the small grammars of flag values: parsed where the flag is read -------------------------
#
# A flag whose value has a little syntax of its own (``--adapt 1:4``, ``--languages en,de``,
# ``--filter-options '{...}'``) is typed by one of these: cyclopts calls the grammar's
# converter, so the config dataclass gets the typed value, from a flag, a ``--config`` file or
# the environment alike, and a bad value is "Invalid value for --adapt: ..." naming the flag.
# The same functions take the text form given in Python (``PipelineConfig(adapt="1:4")``).


def min_max(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` -> ``(MIN, MAX)``, integers with ``0 <= MIN <= MAX`` and ``MAX >= 1``."""
    low, colon, high = str(text).partition(":")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = -1
    if not colon or not 0 <= lo <= hi or hi < 1:
        raise ValueError(f"{text!r}: expected MIN:MAX with 0 <= MIN <= MAX (e.g. 1:8)")
    return lo, hi


def comma_list(text: str | Iterable[str]) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``: items stripped, empty ones dropped, order kept
    (a list, as a config file may give, is taken item by item)."""
    items = str(text).split(",") if isinstance(text, str) else [
        part for item in text for part in str(item).split(",")]
    return tuple(item.strip() for item in items if item.strip())


def json_object_text(text: str | dict[str, Any]) -> dict[str, Any]:
    """A JSON object given as text (a dict passes as it is); the error says why, cut short,
    never echoing a long value."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object {{\"key\": value, ...}}, not "
                         f"{type(value).__name__}")
    return value


def _one_token(parse: Callable[[str], Any]) -> Callable[[Any, Sequence[Token]], Any]:
    def convert(type_: Any, tokens: Sequence[Token]) -> Any:
        return parse(tokens[-1].value)

    return convert


def _comma_tokens(type_: Any, tokens: Sequence[Token]) -> tuple[str, ...]:
    # an environment value is split at whitespace into several tokens, a config file's list
    # gives one per item: all of them are items of the one list
    return comma_list([t.value for t in tokens])


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_size(text: str) -> int:
    """Bytes, with an optional binary unit: ``500M``, ``16G``, ``1T`` (or plain bytes); > 0."""
    number, unit = str(text).strip(), ""
    if number and number[-1].upper() in _SIZE_UNITS:
        number, unit = number[:-1], number[-1].upper()
    try:
        value = int(float(number) * _SIZE_UNITS[unit])
    except (ValueError, OverflowError):  # OverflowError: "inf"
        raise ValueError(f"not a size: {text!r} (e.g. 16G, 500M)") from None
    if value <= 0:
        raise ValueError(f"must be > 0, got {text!r}")
    return value


#: ``--cache-bytes 16G``-like flags: bytes
ByteSize = Annotated[int | None, Parameter(
    converter=_one_token(byte_size), n_tokens=1, accepts_keys=False, metavar="SIZE")]

#: ``--adapt MIN:MAX``-like flags: ``(MIN, MAX)``
MinMax = Annotated[tuple[int, int] | None, Parameter(
    converter=_one_token(min_max), n_tokens=1, accepts_keys=False, metavar="MIN:MAX")]

#: ``--languages en,de``-like flags: the items, stripped, in the order given
CommaList = Annotated[tuple[str, ...], Parameter(
    converter=_comma_tokens, n_tokens=1, accepts_keys=False, consume_multiple=False,
    metavar="A,B,...", show_default=False)]  # the default, none, would show as "()"
OptionalCommaList = Annotated[tuple[str, ...] | None, Parameter(
    converter=_comma_tokens, n_tokens=1, accepts_keys=False, consume_multiple=False,
    metavar="A,B,...")]

#: ``--filter-options '{"a.b": 1}'``-like flags: a JSON object (a config file's table too)
JsonObject = Annotated[dict[str, Any] | None, Parameter(
    converter=_one_token(json_object_text), n_tokens=1, accepts_keys=False, metavar="JSON")]


def env_prefix(component: str) -> str:
    """``SHARDFLOW_PIPELINE_``: the prefix of a component's environment overrides; a field
    ``min_chars`` is read from ``SHARDFLOW_PIPELINE_MIN_CHARS``."""
    return f"{ENV_PREFIX}{component.upper()}_"


def _key(name: str) -> str:
    return name.replace("-", "_")


def _load_yaml(text: str) -> Any:
    """YAML without aliases: a few hundred bytes of nested aliases (``*a``) expand into
    billions of values once the file's tables are turned into options (a "billion laughs"),
    and no config needs them."""
    import yaml

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            mark = event.start_mark
            raise ValueError(f"line {mark.line + 1}: YAML aliases (*name) are not accepted in "
                             "a config file")
    return yaml.safe_load(text) or {}


def _yaml_error(exc: Exception) -> str:
    """A YAML error on one line: its problem and where (PyYAML's own text spans several,
    with a caret under a quoted copy of the line)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
    return f"{type(exc).__name__}: {where}{' '.join(str(problem).split())}"


def load_config_file(path: str, known: Iterable[str]) -> dict[str, Any]:
    """A ``--config`` file as ``{field_name: value}``: TOML (``.toml``), YAML (``.yaml``,
    ``.yml``) or JSON (``.json``); keys with dashes or underscores. An unknown key is an error
    that names it and the known ones: a typo must not be silently ignored."""
    suffix = Path(path).suffix.lower()
    text = read_text(path, "--config", CONFIG_LIMIT)  # a regular file, bounded (UserFileError)
    try:
        if suffix == ".json":
            data = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = _load_yaml(text)
        else:
            data = tomllib.loads(text)
    except ValueError as exc:  # TOML and JSON errors are ValueErrors
        raise ValueError(f"--config {path}: {exc}") from None
    except RecursionError:
        raise ValueError(f"--config {path}: nested too deeply") from None
    except Exception as exc:  # yaml.YAMLError
        raise ValueError(f"--config {path}: {_yaml_error(exc)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a table of keys, not {type(data).__name__}")
    known = set(known)
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = _key(str(key))
        if name not in known:
            raise ValueError(f"--config {path}: unknown key {key!r} "
                             f"(known: {', '.join(sorted(known))})")
        out[name] = value
    return out


def _field_name(argument: Any) -> str | None:
    """The config key of a cyclopts argument: its flag without dashes, or (positional) its
    Python name; ``None`` for a dataclass holding flattened fields."""
    longs = [n for n in argument.names if n.startswith("--") and not n.startswith("--no-")]
    if longs:
        return _key(longs[0][2:])
    if argument.field_info.kind is argument.field_info.VAR_POSITIONAL:
        return argument.field_info.name
    return None


def _table_json(value: dict[str, Any] | list[Any], path: str, name: str) -> str:
    """A config file's table (``storage_options = {...}``) as the JSON its flag takes. TOML
    and YAML have dates and times, which JSON has not: an error naming the key (quote the
    value to pass it as a string), never a ``TypeError`` from ``json.dumps``."""

    def refuse(obj: Any) -> Any:
        raise ConfigFileError(f"--config {path}: {name}: a {type(obj).__name__} value is not "
                              "accepted here (only strings, numbers, booleans, lists and "
                              "tables; quote a date or time to pass it as a string)")

    try:
        return json.dumps(value, default=refuse)
    except (ValueError, RecursionError):  # circular (YAML) or nested too deeply
        raise ConfigFileError(f"--config {path}: {name}: nested too deeply") from None


class FileSource:
    """cyclopts config source for ``--config FILE``: reads the file named by the ``--config``
    token of the command line being parsed and fills every argument the flags left unset."""

    def __call__(self, app: App, commands: tuple[str, ...], arguments: ArgumentCollection) -> None:
        by_name = {n: a for a in arguments if a.parse and (n := _field_name(a)) is not None}
        config = by_name.pop("config", None)
        if config is None or not config.tokens:
            return
        path = config.tokens[-1].value
        try:
            data = load_config_file(path, by_name)
        except ValueError as exc:
            raise ConfigFileError(str(exc)) from None
        rest: dict[str, Any] = {}
        for name, value in data.items():
            argument = by_name[name]
            if argument.tokens:
                continue  # the flag wins
            if isinstance(value, dict) or (isinstance(value, list) and value and all(
                    isinstance(v, dict) for v in value)):
                # a table, or a list of tables (a recipe's [[steps]]): parsed like the flag's
                # JSON
                value = _table_json(value, path, name)
            if argument.field_info.kind is argument.field_info.VAR_POSITIONAL:
                values = value if isinstance(value, list) else [value]
                for i, v in enumerate(values):
                    argument.append(Token(value=str(v), source=path, index=i))
                continue
            rest[name.replace("_", "-")] = value
        # cyclopts' own in-memory source fills the rest: nested under the command's names, as
        # it expects, so that it weighs the keys against this command only (a flag named like
        # another command, `run`'s --steps beside `pipeline steps`, stays a flag)
        for name in reversed(commands):
            rest = {name: rest}
        Dict(rest, source=path)(app, commands, arguments)


def make_app(name: str, help: str, component: str | None, **kwargs: Any) -> App:
    """A cyclopts App whose commands take ``--config FILE`` and ``SHARDFLOW_<COMPONENT>_*``:
    flags first, then the file, then the environment, then the defaults. ``component=None``:
    no environment overrides (a small tool's few flags: ``python -m trainer plot``, the
    loopback S3 servers). ``kwargs`` go to cyclopts' ``App`` (``help_format="plaintext"``
    keeps a help text's own line breaks)."""
    config: list[Any] = [FileSource()]
    if component is not None:
        config.append(Env(env_prefix(component), command=False, show=False))
    options: dict[str, Any] = {"help_format": "rst", "version_flags": (), "config": config}
    return App(name=name, help=help, **(options | kwargs))


#: the ``--config`` parameter every command takes (read by :class:`FileSource`)
ConfigFlag = Annotated[str | None, Parameter(name="--config", metavar="FILE")]


def parse(app: App, argv: Sequence[str]) -> tuple[Callable[..., Any], Any]:
    """(command, bound arguments) for ``argv``; a usage error, a bad value or a bad
    ``--config`` file prints one ``error: ...`` line and exits 2, like argparse did."""
    commands = sorted(name for name in app if not name.startswith("-"))
    if not argv and app.default_command is None and commands:
        print(f"error: a command is required: one of {', '.join(commands)} (see --help)",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        command, bound, _ = app.parse_args(list(argv), exit_on_error=False, print_error=False)
        check_numbers(bound.arguments)
    except CycloptsError as exc:
        print(f"error: {exc}".rstrip(), file=sys.stderr)
        raise SystemExit(2) from None
    except ValueError as exc:  # a config dataclass's own check (__post_init__) of the values
        print(f"error: {exc}".rstrip(), file=sys.stderr)
        raise SystemExit(2) from None
    return command, bound


def check_numbers(arguments: dict[str, Any]) -> None:
    """Every number a command was given, whether by flag, ``--config`` file or environment,
    is finite and bounded: a float within ``±FLOAT_LIMIT`` (``nan`` and ``inf`` parse as
    floats from all three, and a NaN compares false with every bound a field checks, so
    ``--lease-ttl nan`` passed ``lease_ttl > 0``), an int within int64 (NumPy's columns and
    the formats' fields). Dataclass arguments are checked field by field; a field whose
    ``metadata`` says ``finite=False`` may hold any float. The error names the flag."""
    for name, value in arguments.items():
        _check_number(name, value, {})


def _check_number(name: str, value: Any, metadata: Any) -> None:
    if is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            _check_number(f.name, getattr(value, f.name), f.metadata)
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_number(name, item, metadata)
        return
    flag = "--" + name.replace("_", "-")
    if isinstance(value, float):
        if metadata.get("finite", True) and not (math.isfinite(value)
                                                  and abs(value) <= FLOAT_LIMIT):
            raise ValueError(f"{flag}: {value!r} is not a usable number (numbers must be "
                             f"finite and within ±{FLOAT_LIMIT:g})")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_LIMIT:
        raise ValueError(f"{flag}: {value} is out of range (integers must be within "
                         f"±{INT_LIMIT:,})")
