"""What ``python -m pipeline steps`` prints: every built-in step with its options (and their
defaults), its modes and the signals it writes, read from the classes themselves so the list
cannot drift from the code."""

from __future__ import annotations

import inspect
from typing import Any

from pipeline.steps.contract import SIGNAL_TYPES, StepError
from pipeline.steps.registry import BUILTINS, step_class

#: options the pipeline passes itself, never a recipe's
_INTERNAL = {"self", "mode", "storage_options"}


def _options(cls: type) -> dict[str, str]:
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return {}
    out = {}
    for p in params:
        if p.name in _INTERNAL or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out[p.name] = "required" if p.default is p.empty else repr(p.default)
    rule_set = getattr(cls, "rule_set", None)
    if rule_set is not None:  # a rule set's options are its dataclass's fields
        from dataclasses import fields

        from pipeline.steps.rules import RULE_SETS

        out.update({f.name: repr(f.default) for f in fields(RULE_SETS[rule_set])})
    return out


def _signals(cls: type) -> dict[str, str]:
    """The signals the step writes (in annotate mode for a step with modes)."""
    try:
        modes = getattr(cls, "modes", None)
        step = cls(mode="annotate") if modes and "annotate" in modes else None
        found = getattr(step, "signals", None) if step is not None else getattr(
            cls, "signals", None)
    except Exception:  # noqa: BLE001 - a step that needs options to be built: declared only
        found = getattr(cls, "signals", None)
    if not isinstance(found, dict):
        return {}
    return {k: SIGNAL_TYPES.get(v, getattr(v, "__name__", str(v))) for k, v in found.items()}


def describe() -> list[dict[str, Any]]:
    """One entry per built-in step: name, summary, options, modes, signals (or why it is not
    available here: a scorer whose library is not installed)."""
    out = []
    for name in BUILTINS:
        entry: dict[str, Any] = {"name": name}
        try:
            cls = step_class(name)
        except StepError as exc:
            entry["unavailable"] = str(exc)
            out.append(entry)
            continue
        doc = inspect.getdoc(cls) or ""
        entry.update(summary=" ".join(doc.split("\n\n")[0].split()), version=cls.version,
                     modes=list(getattr(cls, "modes", None) or ["filter"]),
                     options=_options(cls), signals=_signals(cls))
        out.append(entry)
    return out


def render(entries: list[dict[str, Any]]) -> str:
    lines = ["Steps (use = NAME in a recipe's [[steps]]; a user step: use = \"module:Class\")", ""]
    for e in entries:
        if "unavailable" in e:
            lines += [f"{e['name']}", f"    not available here: {e['unavailable']}", ""]
            continue
        lines.append(f"{e['name']}  (version {e['version']}; modes: {', '.join(e['modes'])})")
        lines.append(f"    {e['summary']}")
        if e["options"]:
            opts = ", ".join(f"{k}={v}" for k, v in e["options"].items())
            lines.append(f"    options: {opts}")
        if e["signals"]:
            sigs = ", ".join(f"{e['name']}.{k} ({v})" for k, v in e["signals"].items())
            lines.append(f"    signals{' (annotate)' if len(e['modes']) > 1 else ''}: {sigs}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
