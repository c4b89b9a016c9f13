"""The dataset card as Markdown (pure): :class:`~pipeline.output.card_figures.Figures` in,
text out.

Why pure and byte-stable: ``pipeline card DS`` must rebuild the card a run wrote byte for byte,
so nothing here reads a clock, a host or the environment; numbers are formatted one way
(thousands separators, fixed decimals). Every string a manifest or report supplies (reasons,
step names, languages, examples) is untrusted and escaped for a table cell or code span, so a
crafted manifest cannot inject Markdown or HTML into the card.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.output.card_figures import Figures

#: the pictures the card may show, in its order: file name -> alt text
PICTURES = {
    "flow.png": "documents through the steps, and drops by reason",
    "lengths.png": "tokens per document",
    "languages.png": "documents per language",
    "signals.png": "signal histograms",
    "clusters.png": "near-duplicate cluster sizes",
}


def cell(value: Any, width: int = 120) -> str:
    """A value safe in a Markdown table cell: no pipes, newlines, backticks, HTML, links or
    emphasis stars, cut to ``width`` characters (underscores stay: inside a word, as in
    reason names, they emphasise nothing)."""
    text = " ".join(str(value).split())
    text = text if len(text) <= width else text[:width - 3] + "..."
    for a, b in (("\\", "\\\\"), ("|", "\\|"), ("`", "'"), ("<", "&lt;"), (">", "&gt;"),
                 ("*", "\\*"), ("[", "\\["), ("]", "\\]")):
        text = text.replace(a, b)
    return text


def code(value: Any, width: int = 400) -> str:
    """A value safe inside a code span or block: one line, no backticks, cut to ``width``
    (Markdown escapes do not apply inside code, so nothing else is changed)."""
    text = "".join(" " if c in "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029" else c
                   for c in str(value)).replace("`", "'")
    return text if len(text) <= width else text[:width - 3] + "..."


def _n(x: int) -> str:
    return f"{x:,}"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()
           ) -> list[str]:
    align = ["---:" if i in right else "---" for i in range(len(head))]
    return ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |",
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows), ""]


def _picture(name: str, pictures: Sequence[str]) -> list[str]:
    return [f"![{PICTURES[name]}]({name})", ""] if name in pictures else []


def _sample_note(f: Figures) -> str:
    if f.sampled < f.documents:
        return (f"From an evenly spaced sample of {_n(f.sampled)} of the {_n(f.documents)} "
                "documents (whole row groups, the same every time).")
    return f"From all {_n(f.documents)} documents."


def render(f: Figures, pictures: Sequence[str], url: str, signal_lines: Sequence[str] = (),
           text_only: str | None = None) -> str:
    """The card's Markdown. ``pictures``: the PNG files beside it (names of :data:`PICTURES`);
    ``text_only``: why there are none (shown at the top); ``signal_lines``: the signal
    summaries as ``inspect`` prints them; ``url``: the dataset, for the loading examples."""
    out = [f"# {cell(f.title)}", ""]
    out += [f"Shardflow dataset card of the version whose `manifest.json` has sha256 "
            f"`{f.version}` ({f.format}). It describes that version only; `python -m pipeline "
            "card` rebuilds it.", ""]
    if text_only:
        out += [f"> **Text only:** {text_only}", ""]
    tok = f.tokenizer
    per_doc = f.tokens / f.documents if f.documents else 0.0
    out += _table(["", "this version"], [
        ["documents", _n(f.documents)],
        ["tokens", f"{_n(f.tokens)} ({per_doc:,.1f} per document, end-of-document tokens "
                   "included)"],
        ["shards", f"{_n(f.shards)} ({_n(f.row_groups)} row groups), {_n(f.bytes)} bytes"],
        ["tokenizer", f"{cell(tok['name'])} (vocab {_n(tok['vocab_size'])}, end of document "
                      f"`{code(tok['eos_token']).replace('|', chr(92) + '|')}` = "
                      f"{tok['eos_id']})"],
    ])
    if f.view is not None:
        v = f.view
        out += ["## A view", "",
                f"The documents of `{code(v['source'])}` (the folder beside this one, version "
                f"`{code(v['source_version'])}`) where `{code(v['where'])}`: "
                f"{_n(f.documents)} of {_n(_int(v['source_rows']))} documents, "
                f"{_n(f.tokens)} of {_n(_int(v['source_tokens']))} tokens "
                f"({_pct(f.tokens, _int(v['source_tokens']))}). Its source's card says how "
                "they were made.", ""]
    out += _flow(f, pictures)
    out += _languages(f, pictures)
    out += _lengths(f, pictures)
    out += _signals(f, pictures, signal_lines)
    out += _clusters(f, pictures)
    out += _decontamination(f)
    out += _recipe(f)
    out += _loading(f, url)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def _int(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else 0


def _flow(f: Figures, pictures: Sequence[str]) -> list[str]:
    if f.flow is None:
        return []
    fl = f.flow
    out = ["## Documents through the steps", "",
           f"{_n(fl.documents_in)} records read, {_n(fl.documents_out)} documents kept "
           f"({_pct(fl.documents_out, fl.documents_in)}), {_n(fl.tokens)} tokens. Tokens "
           "exist only once the kept texts are tokenized, after the last step.", ""]
    rows = [[cell(s.name), cell(s.kind), _n(s.docs_in), _n(s.dropped), _n(s.quarantined),
             _n(s.docs_out)] for s in fl.stages]
    rows.append(["tokenize", cell(f.tokenizer["name"]), _n(fl.documents_out), "0", "0",
                 f"{_n(fl.documents_out)} ({_n(fl.tokens)} tokens)"])
    out += _table(["stage", "what", "documents in", "dropped", "quarantined", "out"], rows,
                  right=(2, 3, 4, 5))
    if fl.gap:
        out += [f"The manifest counts {_n(fl.documents_out)} documents out, {_n(abs(fl.gap))} "
                f"{'more' if fl.gap > 0 else 'fewer'} than the stages leave: some counts are "
                "not attributed to a stage.", ""]
    out += _picture("flow.png", pictures)
    out += ["### Dropped, by reason", ""]
    out += (_table(["reason", "stage", "documents", "of those read"],
                   [[cell(r), cell(s), _n(n), _pct(n, fl.documents_in)]
                    for r, s, n in f.dropped], right=(2, 3))
            if f.dropped else ["None.", ""])
    out += ["### Quarantined, by reason", "",
            "Records that could not be read or that a step failed on, kept with their "
            "source and reason under `quarantine/`.", ""]
    out += (_table(["reason", "stage", "records"], [[cell(r), cell(s), _n(n)]
                                                   for r, s, n in f.quarantined], right=(2,))
            if f.quarantined else ["None.", ""])
    if f.changed:
        out += ["### Changed (rewritten and kept), by reason", ""]
        out += _table(["change", "documents"], [[cell(r), _n(n)] for r, n in f.changed],
                      right=(1,))
    return out


def _languages(f: Figures, pictures: Sequence[str]) -> list[str]:
    if f.languages is None:
        return []
    out = ["## Languages", "", "The `lang` column (language identification's best guess). "
           + _sample_note(f), ""]
    total = sum(d for _, d, _ in f.languages)
    tokens = sum(t for _, _, t in f.languages)
    out += _table(["lang", "documents", "share", "tokens", "token share"],
                  [[cell(k), _n(d), _pct(d, total), _n(t), _pct(t, tokens)]
                   for k, d, t in f.languages], right=(1, 2, 3, 4))
    return out + _picture("languages.png", pictures)


def _lengths(f: Figures, pictures: Sequence[str]) -> list[str]:
    le = f.lengths
    out = ["## Document length", "", "Tokens per document, end-of-document token included, "
           "counted from the token column's offsets (the ids are not decoded). "
           + _sample_note(f), ""]
    if not le.documents:
        return [*out, "No documents.", ""]
    rows = [["min", _n(le.minimum)],
            *([f"p{p}", f"{v:,.0f}"] for p, v in le.percentiles),
            ["max", _n(le.maximum)], ["mean", f"{le.mean:,.1f}"]]
    out += _table(["", "tokens"], rows, right=(1,))
    return out + _picture("lengths.png", pictures)


def _signals(f: Figures, pictures: Sequence[str], lines: Sequence[str]) -> list[str]:
    if not f.signals:
        return []
    out = ["## Signals", "", "Columns the steps (and dedup) wrote beside `input_ids`, "
           "as `python -m pipeline inspect` summarises them. " + _sample_note(f), ""]
    out += ["```", *(code(line, 300) for line in lines), "```", ""]
    return out + _picture("signals.png", pictures)


def _clusters(f: Figures, pictures: Sequence[str]) -> list[str]:
    out = []
    if f.clusters is not None:
        kept = sum(n for _, n in f.clusters)
        held = sum(s * n for s, n in f.clusters)
        out += ["## Near-duplicate clusters", "",
                "`dedup.cluster_size` of each kept document: the documents of its "
                "near-duplicate cluster before dedup, itself included (1: no near "
                f"duplicate). {_sample_note(f)} The {_n(kept)} kept documents stood for "
                f"{_n(held)} documents of the input.", ""]
        out += _table(["cluster size", "clusters (kept documents)", "documents before dedup"],
                      [[_n(s), _n(n), _n(s * n)] for s, n in f.clusters[:15]]
                      + ([["larger", _n(sum(n for _, n in f.clusters[15:])),
                           _n(sum(s * n for s, n in f.clusters[15:]))]]
                         if len(f.clusters) > 15 else []), right=(0, 1, 2))
        out += _picture("clusters.png", pictures)
    if f.exact_counts is not None:
        out += ["## Exact duplicates", "", "`dedup.exact_count` of each kept document: the "
                "documents with exactly its text, itself included. " + _sample_note(f), ""]
        shown = f.exact_counts[:15]
        out += _table(["copies", "kept documents"], [[_n(s), _n(n)] for s, n in shown]
                      + ([["more", _n(sum(n for _, n in f.exact_counts[15:]))]]
                         if len(f.exact_counts) > 15 else []), right=(0, 1))
    return out


def _decontamination(f: Figures) -> list[str]:
    out = ["## Decontamination", ""]
    if f.report_problem:
        out += [f"Note: {cell(f.report_problem, 200)}.", ""]
    if f.decontamination is None:
        return [*out, "No decontamination was recorded for this dataset (no "
                "`decontaminate.<set>` counts in the manifest, no `contamination.json`).", ""]
    out += ["Documents sharing word n-grams with an evaluation set (`decontaminate` step; "
            "hits in annotate mode are flagged in its signal columns, not dropped).", ""]
    columns = [("examples in it", "eval_examples"), ("documents hit", "documents"),
               ("documents dropped", "dropped"), ("n-grams matched", "ngrams")]
    shown = [(head, key) for head, key in columns  # a column no set has a value in: left out
             if any(getattr(e, key) is not None for e in f.decontamination)]
    out += _table(["evaluation set", *(head for head, _ in shown)],
                  [[cell(e.name), *(_opt(getattr(e, key)) for _, key in shown)]
                   for e in f.decontamination], right=tuple(range(1, len(shown) + 1)))
    for e in f.decontamination:
        if e.examples:
            out += [f"Examples from `{code(e.name)}`:", ""]
            out += [f"- {cell(x, 200)}" for x in e.examples] + [""]
    return out


def _opt(x: int | None) -> str:
    return "-" if x is None else _n(x)


def _recipe(f: Figures) -> list[str]:
    out = ["## Recipe", "", "The steps in order, as the manifest records them (its "
           "`config.steps`); `python -m pipeline run --config` takes them as a TOML file.", ""]
    if not f.recipe:
        out += ["No recipe recorded (a dataset from before steps).", ""]
    else:
        out += ["```toml"]
        for entry in f.recipe:
            out += ["[[steps]]", *(f"{_key(k)} = {_toml(v)}" for k, v in
                                   sorted(entry.items(), key=_recipe_order)), ""]
        out[-1:] = ["```", ""]
    keys = ("dedup", "near_dup", "near_dup_threshold", "dedup_signals", "tokenizer",
            "row_group_tokens", "shard_compression", "cluster_by")
    rows = [[f"`{k}`", f"`{code(json.dumps(f.config[k])).replace('|', '/')}`"]
            for k in keys if k in f.config]
    if rows:
        out += ["Other settings that shaped it:", ""]
        out += _table(["setting", "value"], rows)
    return out


def _recipe_order(kv: tuple[str, Any]) -> tuple[int, str]:
    first = ("use", "name", "mode", "version")
    return (first.index(kv[0]) if kv[0] in first else len(first), kv[0])


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _toml(v: Any) -> str:
    """A recipe value as TOML (JSON's strings, numbers, booleans and lists are TOML's; a
    table becomes an inline table; null, which TOML lacks, a comment-free string)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return '"null"'
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(str(k))} = {_toml(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v)  # ASCII: no backtick or newline can end the code block


def _loading(f: Figures, url: str) -> list[str]:
    url = code(url)
    u = json.dumps(url)
    shell = "'" + url.replace("'", "'\\''") + "'"
    return ["## How to load it", "",
            "Training (the Shardflow loader, without Dask; deterministic and exactly resumable "
            "on any number of ranks):", "",
            "```python", "from loaders import build_dataloader", "",
            f"loader = build_dataloader({u}, batch_size=8, seq_len=1024)",
            "for batch in loader:  # {\"input_ids\": [8, 1024], \"labels\": [8, 1024]}",
            "    ...", "```", "",
            "Or train on it: `torchrun --nproc-per-node 2 -m trainer --data "
            f"{shell}`.", "",
            "For other tools, export it (`input_ids` as `list<int32>`, with every metadata "
            "and signal column):", "",
            "```bash",
            f"python -m pipeline export {shell} out/ --format parquet-list   # or jsonl",
            f"python -m pipeline export {shell} out_hf/ --format hf          # a Hub folder",
            "```", "",
            "```python", "import datasets", "",
            'ds = datasets.load_dataset("out_hf/", split="train")', "```", ""]
