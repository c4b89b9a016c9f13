"""The dataset card's pictures: PNG bytes drawn from :class:`~pipeline.output.card_figures.
Figures` with matplotlib (the ``plot`` extra), imported only here and only when drawing.

Why bytes and fixed settings: a card is rebuilt by ``pipeline card`` and must come out the
same, so every figure is drawn under matplotlib's default style (a user's ``matplotlibrc``
changes nothing), on the Agg backend, at a fixed size and dpi, and saved without the
``Software`` text chunk (matplotlib's version); Agg's PNG has no timestamp. Without matplotlib
:func:`available` says why, and the card is text only.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np

from infra import environment
from pipeline.output.card_figures import Figures

#: set to 0 to draw no pictures (the card is then text only, and says so)
ENV_PLOTS = "SHARDFLOW_CARD_PLOTS"
DPI = 90
_BLUE, _GRAY, _RED, _ORANGE = "tab:blue", "tab:gray", "tab:red", "tab:orange"


def available() -> str | None:
    """``None`` when pictures can be drawn; else why not, for the card's note."""
    if environment.value(ENV_PLOTS) == "0":
        return f"pictures turned off ({ENV_PLOTS}=0)."
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("matplotlib is not installed, so this card has no pictures; install the "
                "'plot' extra (pip install 'shardflow[plot]') and run `python -m pipeline "
                "card` to add them.")
    return None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(f: Figures, signals: Callable[[io.BytesIO], int] | None = None) -> dict[str, bytes]:
    """The card's PNGs by file name: ``flow.png`` (not for a view), ``lengths.png`` (when
    there are documents), ``languages.png`` (a ``lang`` column), ``clusters.png``
    (``dedup.cluster_size``), and ``signals.png`` drawn by ``signals`` (which writes one PNG
    into the buffer it is given and returns its panel count: ``signal_summary.plot``)."""
    plt = _pyplot()
    import matplotlib.style

    out: dict[str, bytes] = {}
    with matplotlib.style.context("default"):
        if f.flow is not None:
            out["flow.png"] = _save(plt, _flow(plt, f))
        if f.lengths.documents:
            out["lengths.png"] = _save(plt, _lengths(plt, f))
        if f.languages:
            out["languages.png"] = _save(plt, _languages(plt, f))
        if f.clusters:
            out["clusters.png"] = _save(plt, _clusters(plt, f))
        if f.signals and signals is not None:
            buf = io.BytesIO()
            if signals(buf):
                out["signals.png"] = buf.getvalue()
    return out


def _save(plt: Any, fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _whole(axis: Any) -> None:
    """Ticks on whole numbers only (counts of documents)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _short(text: str, width: int = 28) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _sample(f: Figures) -> str:
    return (f"from {f.sampled:,} of {f.documents:,} documents" if f.sampled < f.documents
            else f"{f.documents:,} documents")


def _flow(plt: Any, f: Figures) -> Any:
    """Left: documents left after each stage (what each removed stacked on top). Right:
    the drop and quarantine reasons, largest first."""
    assert f.flow is not None
    stages = f.flow.stages
    reasons = [(r, n, "dropped") for r, _s, n in f.dropped]
    reasons += [(r, n, "quarantined") for r, _s, n in f.quarantined]
    reasons = sorted(reasons, key=lambda t: (-t[1], t[0]))[:15]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * max(len(stages) + 1,
                                                                     len(reasons), 6) + 1.4),
                                      gridspec_kw={"width_ratios": [1.15, 1]})
    names = [_short(s.name) for s in stages] + ["tokenized"]
    kept = [s.docs_out for s in stages] + [f.flow.documents_out]
    lost = [s.dropped for s in stages] + [0]
    bad = [s.quarantined for s in stages] + [0]
    y = np.arange(len(names))[::-1]
    ends = np.add(np.add(kept, lost), bad)
    left.barh(y, kept, height=0.6, color=_BLUE, label="passed")
    left.barh(y, lost, height=0.6, left=kept, color=_GRAY, label="dropped")
    left.barh(y, bad, height=0.6, left=np.add(kept, lost), color=_RED, label="quarantined")
    left.set_yticks(y, names, fontsize=8)
    left.set_xlabel("documents", fontsize=8)
    left.set_title("documents through the stages", fontsize=10)
    for yi, k, e in zip(y, kept, ends, strict=True):
        left.text(e, yi, f" {k:,}", va="center", fontsize=7)
    left.set_xlim(0, max(1, int(max(ends))) * 1.22)
    _whole(left.xaxis)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3,
                frameon=False)
    left.tick_params(labelsize=7)
    if reasons:
        ry = max(len(reasons), len(names)) - 1 - np.arange(len(reasons))  # from the top
        counts = [n for _, n, _ in reasons]
        right.barh(ry, counts, height=0.6,
                   color=[_GRAY if k == "dropped" else _RED for _, _, k in reasons])
        right.set_yticks(ry, [_short(r) for r, _, _ in reasons], fontsize=8)
        for yi, n in zip(ry, counts, strict=True):
            right.text(n, yi, f" {n:,}", va="center", fontsize=7)
        right.set_xlim(0, max(counts) * 1.25)
        _whole(right.xaxis)
        right.set_ylim(-0.5, max(len(reasons), len(names)) - 0.5)
    else:
        right.text(0.5, 0.5, "nothing dropped or quarantined", ha="center", va="center",
                   transform=right.transAxes)
        right.set_yticks([])
    right.set_title("dropped (gray) and quarantined (red), by reason", fontsize=10)
    right.set_xlabel("documents", fontsize=8)
    right.tick_params(labelsize=7)
    fig.suptitle(f"{_short(f.title, 60)}: {f.flow.documents_in:,} read -> "
                 f"{f.flow.documents_out:,} kept, {f.flow.tokens:,} tokens", fontsize=11)
    fig.tight_layout()
    return fig


def _lengths(plt: Any, f: Figures) -> Any:
    le = f.lengths
    fig, ax = plt.subplots(figsize=(8, 3.8))
    edges = np.asarray(le.edges)
    ax.stairs(le.counts, edges, fill=True, color=_BLUE, alpha=0.85)
    ax.set_xscale("log")
    marks = dict(le.percentiles)
    for p, style in ((50, "-"), (10, ":"), (90, ":")):
        if p in marks:
            ax.axvline(max(marks[p], 1), color="black", linestyle=style, linewidth=1)
            ax.text(max(marks[p], 1), ax.get_ylim()[1] * 0.95, f" p{p} {marks[p]:,.0f}",
                    fontsize=7, va="top")
    ax.set_xlabel("tokens per document (log scale)", fontsize=9)
    _whole(ax.yaxis)
    ax.set_ylabel("documents", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_title(f"document length: mean {le.mean:,.1f}, max {le.maximum:,} tokens "
                 f"({_sample(f)})", fontsize=10)
    fig.tight_layout()
    return fig


def _languages(plt: Any, f: Figures) -> Any:
    assert f.languages is not None
    langs = list(f.languages)
    fig, ax = plt.subplots(figsize=(8, 0.35 * max(len(langs), 4) + 1.2))
    y = np.arange(len(langs))[::-1]
    docs = [d for _, d, _ in langs]
    ax.barh(y, docs, color=_ORANGE)
    ax.set_yticks(y, [_short(k, 16) for k, _, _ in langs], fontsize=8)
    total = sum(docs)
    for yi, d in zip(y, docs, strict=True):
        ax.text(d, yi, f" {d:,} ({100 * d / total:.1f}%)", va="center", fontsize=7)
    ax.margins(x=0.25)
    ax.set_xlabel("documents", fontsize=9)
    _whole(ax.xaxis)
    ax.tick_params(labelsize=8)
    ax.set_title(f"languages ({_sample(f)})", fontsize=10)
    fig.tight_layout()
    return fig


def _clusters(plt: Any, f: Figures) -> Any:
    assert f.clusters is not None
    sizes = list(f.clusters)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [f"{s:,}" for s, _ in sizes[:20]] + (["more"] if len(sizes) > 20 else [])
    counts = [n for _, n in sizes[:20]] + ([sum(n for _, n in sizes[20:])]
                                           if len(sizes) > 20 else [])
    x = np.arange(len(labels))
    ax.bar(x, counts, color=_BLUE)
    ax.set_xticks(x, labels, fontsize=8)
    if max(counts) > 20 * max(1, min(counts)):
        ax.set_yscale("log")
    else:
        _whole(ax.yaxis)
    for xi, n in zip(x, counts, strict=True):
        ax.text(xi, n, f"{n:,}", ha="center", va="bottom", fontsize=7)
    ax.set_xlabel("near-duplicate cluster size (documents before dedup)", fontsize=9)
    ax.set_ylabel("clusters (kept documents)", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.set_title(f"near-duplicate clusters ({_sample(f)})", fontsize=10)
    fig.tight_layout()
    return fig
