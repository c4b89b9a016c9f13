"""Near-dup dedup quality against exact Jaccard, and memory per task as the corpus grows.

A synthetic corpus with planted near-duplicates (deterministic seed): *families* of documents,
each a random base text (250-400 words from a 50,000-word vocabulary) and 1-6 copies, each
made from a random earlier member of its family (so chains of edits) by word substitutions,
insertions and deletions at a rate drawn from ``RATES`` (0: an exact copy), plus unrelated
documents; the whole corpus is shuffled, so chains come in any order. Keys and sketches are
phase 1's (``content_key``, ``MinHasher.keys_and_sketch`` at the pipeline's defaults: 256
permutations, 21 bands of 5 rows, 5-word shingles, a sketch of 256 bytes a document), written
per partition of 100 documents to a local store, and the dedup shuffle runs as the job runs it
(``shuffle.run`` with the default threshold 0.7: candidates verified on the sketches) on an
in-process mapper that measures each task's peak Python/NumPy allocation (tracemalloc), with
buckets of a fixed number of keys (``--task-keys``), so buckets grow with the corpus as the
job's do.

Truth: exact Jaccard similarity of the documents' 5-word shingle sets (the MinHasher's
shingles, unhashed), over every pair sharing at least one shingle (an inverted index; any other
pair has Jaccard 0). Two documents are duplicates when they are connected by pairs with
Jaccard >= the threshold, 0.7; of each such component every document but the first should
go. Scores, on the set of dropped documents (exact and near): precision (dropped that should
go) and recall (that should go and were dropped), for

- ``pipeline`` (now): components of the LSH candidate edges whose sketches estimate a Jaccard
  >= 0.7 (``pipeline.dedup.verify``); all but each component's smallest (partition, position)
  go. Checked equal to the same rule computed in memory;
- ``unverified``: components of every candidate edge, same bands;
- ``before``: the previous defaults (128 permutations, 16 bands of 8 rows, no verification,
  components of every candidate edge).

Also: pairwise precision/recall of the pipeline's components (pairs in one predicted component
vs pairs in one true component), the LSH candidate pairs' hit rate by Jaccard against the
theoretical S-curve 1 - (1 - s^r)^b, and per corpus size the peak memory of each step's
biggest task.

    python benchmarks/near_dup_quality.py            # 1x, 4x, 16x (1,000 to 17,000 docs)
    python benchmarks/near_dup_quality.py --big      # and 64x
    python benchmarks/near_dup_quality.py --quick    # 1x, 4x
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, machine, write_results  # noqa: E402
from pipeline.config import PipelineConfig  # noqa: E402
from pipeline.dedup import (  # noqa: E402
    ENTRY,
    KIND_EXACT,
    KIND_NEAR,
    MinHasher,
    components,
    content_key,
    entries,
    resolve,
    shuffle,  # noqa: E402
    verify,
)
from pipeline.tasks import work
from storage import ReplicaSet  # noqa: E402

#: edit rates of a family member against the member it was made from (0: an exact copy)
RATES = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.3)
#: the pipeline's defaults (pipeline.config.PipelineConfig)
PERMS, BANDS, ROWS, SHINGLE, THRESHOLD = 256, 21, 5, 5, 0.7
#: the defaults before candidates were verified
OLD_PERMS, OLD_BANDS, OLD_ROWS = 128, 16, 8
PART_DOCS = 100


def corpus(scale: int, seed: int = 0) -> tuple[list[str], list[float]]:
    """``scale`` x (100 families + 600 unrelated documents), shuffled; each document's edit
    rate against its parent (-1: a family's base or an unrelated document)."""
    rng = np.random.default_rng(seed + scale)
    vocab = [f"w{zlib.crc32(str(i).encode()):08x}" for i in range(50_000)]

    def text() -> list[str]:
        return [vocab[i] for i in rng.integers(0, len(vocab), int(rng.integers(250, 400)))]

    def edit(words: list[str], rate: float) -> list[str]:
        out = []
        for w in words:
            if rng.random() >= rate:
                out.append(w)
                continue
            op = rng.integers(3)
            if op == 0:  # substitute
                out.append(vocab[rng.integers(len(vocab))])
            elif op == 1:  # insert
                out += [w, vocab[rng.integers(len(vocab))]]
            # op 2: delete
        return out

    docs: list[tuple[list[str], float]] = []
    for _ in range(100 * scale):
        family = [text()]
        docs.append((family[0], -1.0))
        for _ in range(int(rng.integers(1, 7))):
            rate = float(RATES[rng.integers(len(RATES))])
            family.append(edit(family[int(rng.integers(len(family)))], rate))
            docs.append((family[-1], rate))
    docs += [(text(), -1.0) for _ in range(600 * scale)]
    order = rng.permutation(len(docs))
    return [" ".join(docs[i][0]) for i in order], [docs[i][1] for i in order]


def shingles(text: str) -> set[tuple[str, ...]]:
    words = text.lower().split() or [""]
    k = min(SHINGLE, len(words))
    return {tuple(words[i:i + k]) for i in range(len(words) - k + 1)}


def true_pairs(texts: list[str]) -> dict[tuple[int, int], float]:
    """``{(i, j): Jaccard}`` for every pair i < j sharing a shingle (all others are 0)."""
    sets = [shingles(t) for t in texts]
    index: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(sets):
        for sh in s:
            index[hash(sh)].append(i)
    pairs: set[tuple[int, int]] = set()
    for holders in index.values():
        if len(holders) > 1:
            pairs.update((a, b) for x, a in enumerate(holders) for b in holders[x + 1:])
    return {(a, b): len(sets[a] & sets[b]) / len(sets[a] | sets[b]) for a, b in sorted(pairs)}


def truth_drops(n: int, pairs: dict[tuple[int, int], float]) -> tuple[set[int], dict[int, int]]:
    above = [(a, b) for (a, b), j in pairs.items() if j >= THRESHOLD]
    roots = components.components_reference(np.array([a for a, _ in above], np.uint64),
                                            np.array([b for _, b in above], np.uint64))
    return {x for x, r in roots.items() if x != r}, roots


class Measured:
    """A :data:`pipeline.dedup.shuffle.Mapper` running tasks here, each one's peak allocation
    kept."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = defaultdict(int)
        self.tasks: dict[str, int] = defaultdict(int)

    def __call__(self, name: str, fn: Any, args: list[tuple[Any, ...]]) -> list[Any]:
        step = "components" if name.startswith("components-") else name
        out = []
        for a in args:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            out.append(fn(*a))
            self.peak[step] = max(self.peak[step], tracemalloc.get_traced_memory()[1] - base)
            self.tasks[step] += 1
        return out


def scores(dropped: set[int], should: set[int]) -> dict[str, float]:
    hit = len(dropped & should)
    return {"dropped": len(dropped), "should_drop": len(should), "correct": hit,
            "precision": round(hit / len(dropped), 4) if dropped else 1.0,
            "recall": round(hit / len(should), 4) if should else 1.0}


def pairwise(pred: dict[int, int], truth: dict[int, int]) -> dict[str, float]:
    """Pairs of documents in one predicted component vs in one true component."""
    def pairs(roots: dict[int, int]) -> set[tuple[int, int]]:
        groups: dict[int, list[int]] = defaultdict(list)
        for x, r in roots.items():
            groups[r].append(x)
        return {(a, b) for g in groups.values() for a in sorted(g) for b in sorted(g) if a < b}
    p, t = pairs(pred), pairs(truth)
    return {"pairs_predicted": len(p), "pairs_true": len(t),
            "precision": round(len(p & t) / len(p), 4) if p else 1.0,
            "recall": round(len(p & t) / len(t), 4) if t else 1.0}


def _components_drops(near: np.ndarray, exact: set[int],
                      keep: Any = None) -> tuple[set[int], dict[int, int]]:
    """Drops of the components rule over the star edges of band-key entries ``near`` (with
    ``keep(a, b)``: only the edges it accepts), and each document's root."""
    a, b = components.star_edges(near)
    ga, gb = _docs(a), _docs(b)
    if keep is not None and len(ga):
        ok = keep(ga, gb)
        ga, gb = ga[ok], gb[ok]
    roots = components.components_reference(ga.astype(np.uint64), gb.astype(np.uint64))
    return exact | {x for x, r in roots.items() if x != r}, roots


def _docs(node: np.ndarray) -> np.ndarray:
    part, pos = components.where(node)
    return part.astype(np.int64) * PART_DOCS + pos


def _near_entries(bands: list[list[bytes]]) -> np.ndarray:
    """Band-key entries of documents numbered in input order, partitions of PART_DOCS."""
    out = []
    for p, lo in enumerate(range(0, len(bands), PART_DOCS)):
        docs = range(lo, min(len(bands), lo + PART_DOCS))
        out.append(entries([k for i in docs for k in bands[i]],
                           [i - lo for i in docs for _ in bands[i]],
                           [KIND_NEAR] * sum(len(bands[i]) for i in docs), part=p))
    return np.concatenate(out)


def point(scale: int, task_keys: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    texts, _rates = corpus(scale)
    n = len(texts)
    mh = MinHasher(PERMS, BANDS, SHINGLE, rows=ROWS)
    parts = [range(lo, min(n, lo + PART_DOCS)) for lo in range(0, n, PART_DOCS)]
    all_keys: list[np.ndarray] = []
    sketches = np.zeros((n, PERMS), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        store = ReplicaSet.from_urls([tmp])
        names, per_part = [], []
        for p, docs in enumerate(parts):
            keys, pos, kinds = [], [], []
            for i in docs:  # what phase 1 computes per document (stages.phase_one)
                bands, sketches[i] = mh.keys_and_sketch(texts[i])
                keys += [content_key(texts[i])] + bands
                pos += [i - docs.start] * (1 + len(bands))
                kinds += [KIND_EXACT] + [KIND_NEAR] * len(bands)
            arr = entries(keys, pos, kinds, part=p)
            all_keys.append(arr)
            names.append(f"p{p:05d}")
            per_part.append(len(arr))
            work.save_array(store, work.keys_path(names[-1]), arr.astype(ENTRY))
            work.save_array(store, work.sketches_path(names[-1]),
                            sketches[docs.start:docs.stop].ravel())
        t_keys = time.perf_counter() - t0
        total = sum(per_part)
        buckets = -(-total // task_keys)
        mapper = Measured()
        tracemalloc.start()
        t1 = time.perf_counter()
        out = shuffle.run(mapper, store, "bench", names, per_part, buckets, task_keys,
                          threshold=THRESHOLD, perms=PERMS)
        t_shuffle = time.perf_counter() - t1
        tracemalloc.stop()
        new: set[int] = set()
        kinds_new = {"duplicate": 0, "near_duplicate": 0}
        for p, where in out.drops.items():
            for d in shuffle.pick(store, where):
                new.add(p * PART_DOCS + int(d["pos"]))
                kinds_new["duplicate" if d["kind"] == KIND_EXACT else "near_duplicate"] += 1
    everything = np.concatenate(all_keys)
    exact = {int(d["part"]) * PART_DOCS + int(d["pos"])
             for d in resolve(everything[everything["kind"] == KIND_EXACT])}
    near = everything[everything["kind"] == KIND_NEAR]
    # the same rule in memory (star edges verified on the sketches, then components): the
    # pipeline's drops must match it
    ref, pred_roots = _components_drops(
        near, exact, lambda a, b: verify.verified(sketches[a], sketches[b], THRESHOLD))
    assert new == ref, "shuffle != reference"
    unverified, _ = _components_drops(near, exact)
    old_mh = MinHasher(OLD_PERMS, OLD_BANDS, SHINGLE, rows=OLD_ROWS)
    before, _ = _components_drops(_near_entries([old_mh.band_keys(t) for t in texts]), exact)
    t2 = time.perf_counter()
    pairs = true_pairs(texts)
    should, true_roots = truth_drops(n, pairs)
    # LSH candidate pairs (sharing a band) by Jaccard, against the S-curve
    band_of: dict[tuple[int, int], set[int]] = defaultdict(set)
    for e in near:
        band_of[(int(e["k0"]), int(e["k1"]))].add(int(e["part"]) * PART_DOCS + int(e["pos"]))
    candidates = {(x, y) for holders in band_of.values() if len(holders) > 1
                  for x in holders for y in holders if x < y}
    bins = np.linspace(0, 1, 11)
    curve = []
    for lo, hi in zip(bins[:-1], bins[1:], strict=True):
        inside = [pr for pr, j in pairs.items() if lo <= j < hi or (hi == 1 and j == 1)]
        if inside:
            s = (lo + hi) / 2
            curve.append({"jaccard": [round(lo, 1), round(hi, 1)], "pairs": len(inside),
                          "candidate_rate": round(sum(p in candidates for p in inside)
                                                  / len(inside), 4),
                          "theory_at_mid": round(1 - (1 - s ** ROWS) ** BANDS, 4)})
    above = {pr for pr, j in pairs.items() if j >= THRESHOLD}
    return {
        "scale": scale, "documents": n, "keys": total, "buckets": buckets,
        "key_groups": out.groups, "components_steps": out.components_steps,
        "dropped_by_kind": kinds_new,
        "pipeline": scores(new, should),
        "unverified": scores(unverified, should),
        "before": scores(before, should),
        "pipeline_pairwise": pairwise({**pred_roots, **{x: x for x in range(n)
                                                        if x not in pred_roots}},
                                      {**true_roots, **{x: x for x in range(n)
                                                        if x not in true_roots}}),
        "candidate_pairs": {"pairs": len(candidates),
                            "precision": round(len(candidates & above) / len(candidates), 4)
                            if candidates else 1.0,
                            "recall": round(len(candidates & above) / len(above), 4)
                            if above else 1.0},
        "s_curve": curve,
        "peak_task_bytes": dict(mapper.peak), "tasks": dict(mapper.tasks),
        "work_bytes_per_doc": {"keys": round(total * ENTRY.itemsize / n, 1),
                               "sketches": PERMS},
        "seconds": {"keys": round(t_keys, 2), "shuffle": round(t_shuffle, 2),
                    "truth": round(time.perf_counter() - t2, 2)},
    }


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = results["points"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    s = np.linspace(0, 1, 200)
    ax1.plot(s, 1 - (1 - s ** ROWS) ** BANDS, color="grey",
             label=f"theory, {BANDS} bands x {ROWS}")
    big = pts[-1]
    mids = [np.mean(c["jaccard"]) for c in big["s_curve"]]
    ax1.plot(mids, [c["candidate_rate"] for c in big["s_curve"]], "o-",
             label=f"measured, {big['documents']} docs")
    ax1.axvline(THRESHOLD, ls="--", color="k", lw=0.8, label=f"threshold {THRESHOLD:.3f}")
    ax1.set_xlabel("exact Jaccard of a pair (5-word shingles)")
    ax1.set_ylabel("share of pairs that share a band")
    ax1.legend(fontsize=8)
    ax1.set_title("LSH candidates vs exact Jaccard")
    docs = [p["documents"] for p in pts]
    for step in pts[0]["peak_task_bytes"]:
        ax2.plot(docs, [p["peak_task_bytes"][step] / 2**20 for p in pts], "o-", label=step)
    ax2.set_xscale("log")
    ax2.set_xlabel("documents in the corpus")
    ax2.set_ylabel("peak allocation of the biggest task (MiB)")
    ax2.set_ylim(bottom=0)
    ax2.legend(fontsize=8)
    new = ", ".join(f"{p['pipeline']['precision']:.3f}/{p['pipeline']['recall']:.3f}"
                    for p in pts)
    old = ", ".join(f"{p['before']['precision']:.3f}/{p['before']['recall']:.3f}" for p in pts)
    ax2.set_title(f"precision/recall: verified {new}\nbefore (16x8, unverified) {old}",
                  fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1x and 4x only")
    ap.add_argument("--big", action="store_true", help="also 64x (~67,000 documents; the "
                    "exact-Jaccard truth takes several minutes)")
    ap.add_argument("--task-keys", type=int, default=8192,
                    help="keys per shuffle task (the job's is 512 Ki; smaller here so that "
                         "buckets grow with these small corpora)")
    args = ap.parse_args()
    cfg = PipelineConfig()
    assert (cfg.minhash_perms, cfg.minhash_bands, cfg.minhash_rows, cfg.shingle_words,
            cfg.near_dup_threshold) == (PERMS, BANDS, ROWS, SHINGLE, THRESHOLD), \
        "the benchmark measures the pipeline's defaults: update PERMS, BANDS, ... to them"
    point(1, args.task_keys)  # warm-up: first calls allocate NumPy's and tracemalloc's own
    pts = []
    for scale in (1, 4) if args.quick else (1, 4, 16, 64) if args.big else (1, 4, 16):
        pts.append(point(scale, args.task_keys))
        print({k: pts[-1][k] for k in ("documents", "buckets", "components_steps",
                                       "pipeline", "unverified", "before",
                                       "peak_task_bytes")}, flush=True)
    results = {
        "benchmark": "near_dup_quality", "machine": machine(),
        "threshold": THRESHOLD, "minhash": {"perms": PERMS, "bands": BANDS, "rows": ROWS,
                                            "shingle_words": SHINGLE, "sketch_bytes": PERMS},
        "before_minhash": {"perms": OLD_PERMS, "bands": OLD_BANDS, "rows": OLD_ROWS},
        "edit_rates": RATES, "task_keys": args.task_keys, "points": pts,
        "note": "dropped-document precision/recall against exact-Jaccard components at the "
                "threshold; peak_task_bytes: tracemalloc peak of each step's biggest task",
    }
    name = "near_dup_quality_quick" if args.quick else "near_dup_quality"
    path = write_results(name, results)
    plot(results, RESULTS / f"{name}.png")
    print(path)


if __name__ == "__main__":
    main()
