"""The text ``trace`` prints: one aligned line per fact, the same facts as its ``--json``."""

from __future__ import annotations

import json
from typing import Any


def _step_line(step: dict[str, Any]) -> str:
    kind = step.get("kind")
    if kind == "dedup":
        return f"dedup ({step.get('mode')})"
    if kind == "tokenizer":
        return (f"tokenize: {step.get('tokenizer')} (vocab {step.get('vocab_size')}, sha256 "
                f"{str(step.get('sha256'))[:12]}...)")
    opts = ", ".join(f"{k}={json.dumps(v)}" for k, v in (step.get("options") or {}).items())
    head = (f"{step.get('name')} ({step.get('use')} v{step.get('version')}, {step.get('mode')}"
            f"; config_sha256 {str(step.get('config_sha256'))[:12]}...)")
    return f"{head}: {opts}" if opts else head


def _document(doc: dict[str, Any], label: str = "document") -> list[str]:
    where = ("the doc id is its source" if doc["source_in"] == "doc_id"
             else "from the source column")
    lines = [f"{label:<11} {doc['doc_id']}",
             f"source      {doc['source']} ({where})",
             f"in          {doc['shard']}, row {doc['row']} (row group {doc['row_group']}), "
             f"{doc['tokens']:,} tokens"]
    for k, v in sorted(doc.get("metadata", {}).items()):
        lines.append(f"{k:<11} {json.dumps(v)}")
    return lines


def render(answer: dict[str, Any]) -> str:
    """A trace or ``--dropped`` answer as text."""
    status = answer.get("status")
    lines: list[str] = []
    if "steps" not in answer:  # a --dropped answer: the source asked about first
        lines.append(f"source      {answer.get('source')}")
    if status == "kept" and "steps" in answer:
        lines += _document(answer["document"])
        lines.append("steps       " + _step_line(answer["steps"][0]) if answer["steps"] else
                     "steps       none")
        lines += [f"            -> {_step_line(s)}" for s in answer["steps"][1:]]
        code = answer.get("code") or {}
        if code:
            commit = code.get("git_commit")
            lines.append(f"code        {code.get('package')} {code.get('version')}"
                         + (f" (git {commit[:12]})" if commit else ""))
        inputs = answer.get("inputs") or {}
        if inputs:
            lines.append(f"inputs      {inputs.get('files'):,} files, listing sha256 "
                         f"{str(inputs.get('sha256'))[:12]}...")
        signals = answer["document"]["signals"]
        lines.append(f"signals     {'none' if not signals else ''}".rstrip())
        lines += [f"  {k} = {json.dumps(v)}" for k, v in sorted(signals.items())]
    elif status == "kept":
        lines.append("status      kept (in the dataset)")
        lines += _document(answer["document"])
    elif status == "dropped":
        step = answer["step"]
        named = _step_line(step) if "use" in step else step["name"]
        lines.append(f"status      dropped by step {named}")
        lines.append(f"reason      {answer['reason']}")
        lines.append(f"record      {answer['record']}")
    elif status == "quarantined":
        lines.append(f"status      quarantined: {answer['reason']} ({answer['detail']})")
        lines.append(f"file        {answer.get('file')}")
        lines.append(f"record      {answer['record']}")
        lines.append(f"raw         {json.dumps(answer.get('raw', ''))}")
    else:  # duplicate / near_duplicate
        lines.append(f"status      {status} of the kept document below")
        lines.append(f"record      {answer['record']}")
        if answer.get("of"):
            lines += _document(answer["of"], "kept")
        else:
            lines.append("kept        (not found: the kept document's shard is missing)")
    return "\n".join(lines) + "\n"
