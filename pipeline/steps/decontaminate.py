"""The ``decontaminate`` step: drop (filter mode) or flag (annotate mode) documents that share
word n-grams with evaluation sets the user gives (:mod:`pipeline.steps.ngrams` holds the
normalisation, the hashes and the index).

**Eval sets** are files or globs (``eval``; ``--decontaminate a.jsonl,'evals/*.parquet'``):
JSON Lines (``text_field`` of each object; default ``text``), Parquet (its ``text_field``
column) or plain text (one example per non-empty line). Each file is one set, named by its
file name up to the first dot (``mmlu.test.jsonl`` -> ``mmlu``); two files with one name are an
error. A file that is missing, not a regular file (a FIFO is refused without being opened:
:mod:`infra.user_files`), empty, over :data:`EVAL_FILE_LIMIT`, or not what its suffix says
is one ``ValueError`` naming it (the run stops before anything is written).

**Built once per process, not shipped**: the driver builds the index to check the files and
pin their content (``eval_sha256``, a hash of each set's name and file bytes, enters the
recipe's options, so the manifest and the partition keys change with the eval files and a
changed eval set redoes every partition); each worker process builds it once from the same
files (:func:`cached_index`, as :func:`pipeline.steps.fasttext_scorer.cached_model` loads a
model) and refuses to run if their content is not the pinned one. The files are local paths
(a glob is expanded where the index is built): every worker must see the same files at the
same paths, as a LocalCluster's do; one that sees other bytes (or none) stops the task with
one line naming the files. Shipping it in the recipe
would send ~12 MB per million eval n-grams with every phase-1 task; a worker reads the files
in well under a second per million n-grams.

**Counts and signals**: in filter mode a contaminated document is dropped as
``decontaminate.<set>`` (``stats.dropped``); in annotate mode every document gets
``decontaminate.hits`` (its distinct n-grams found in any set), ``decontaminate.overlap`` (the
largest share of one eval example's n-grams it holds) and ``decontaminate.set`` (the set that
would drop it, ``""`` for none), and nothing is dropped. Either way the step keeps, per set,
the documents it found and the matched n-grams of the first :data:`REPORT_EXAMPLES` of them
(:meth:`Decontaminate.report`), which the run writes as ``contamination.json``.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import threading
from dataclasses import dataclass
from typing import Annotated, Any

from cyclopts import Parameter

from infra.config import OptionalCommaList, comma_list
from infra.user_files import UserFileError, read_regular
from pipeline.config_field import flag
from pipeline.steps.contract import REPORT_EXAMPLES, Doc
from pipeline.steps.ngrams import DEFAULT_N, EvalIndex, words

#: the most bytes read of one eval file (eval sets are small; a mistake is not read whole)
EVAL_FILE_LIMIT = 1 << 30
#: matched n-grams kept per reported document
REPORT_NGRAMS = 5
MODES = ("filter", "annotate")


@dataclass
class DecontaminateFlags:
    """The ``decontaminate`` step's options as ``pipeline run`` flags (the default recipe runs
    it after the other steps, before tokenizing, when ``--decontaminate`` is given)."""

    decontaminate: Annotated[OptionalCommaList, Parameter(metavar="FILE_OR_GLOB[,...]")] = flag(
        None, "evaluation sets to keep out of the dataset: JSONL (its 'text' field), Parquet "
        "('text' column) or text files (one example per line), one set per file named by its "
        "stem; documents sharing a 13-word n-gram (lower-cased, punctuation stripped) with one "
        "are dropped as decontaminate.<set>, and contamination.json reports the hits",
        manifest=False)
    decontaminate_n: int = flag(DEFAULT_N, "with --decontaminate: words per n-gram",
                                manifest=False)
    decontaminate_min_overlap: float = flag(
        0.0, "with --decontaminate: the share of an eval example's n-grams a document must "
        "hold to count as contaminated (0: any one n-gram, as GPT-3 and datatrove)",
        manifest=False)
    decontaminate_mode: str = flag(
        "filter", "with --decontaminate: 'filter' drops contaminated documents, 'annotate' "
        "keeps them all and writes decontaminate.hits/.overlap/.set columns", manifest=False)

    def check_decontaminate(self) -> None:
        if self.decontaminate is not None:  # given in Python as text: the flag's grammar
            self.decontaminate = comma_list(self.decontaminate)
        check_options(self.decontaminate_n, self.decontaminate_min_overlap)
        if self.decontaminate_mode not in MODES:
            raise ValueError("decontaminate mode must be 'filter' or 'annotate', not "
                             f"{self.decontaminate_mode!r}")

    def decontaminate_options(self) -> dict[str, Any] | None:
        """The step's recipe options the flags give (``None``: no ``--decontaminate``)."""
        if not self.decontaminate:  # unset, or given as "" (no file: no step, as before)
            return None
        return {"eval": list(self.decontaminate), "n": self.decontaminate_n,
                "min_overlap": self.decontaminate_min_overlap}


def check_options(n: Any, min_overlap: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
        raise ValueError(f"decontaminate n must be a number of words from 1 to 64, not {n!r}")
    if isinstance(min_overlap, bool) or not isinstance(min_overlap, int | float) \
            or not 0.0 <= min_overlap <= 1.0:
        raise ValueError(f"decontaminate min_overlap must be a fraction from 0 to 1, not "
                         f"{min_overlap!r}")


def eval_files(patterns: list[str]) -> list[tuple[str, str]]:
    """``(set name, path)`` of every file the patterns name, sorted by set name; a pattern
    that names nothing, or two files with one set name, is an error."""
    if isinstance(patterns, str) or not isinstance(patterns, list) or not patterns \
            or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError(f"decontaminate eval: a list of files or globs, not {patterns!r}")
    found: dict[str, str] = {}
    for pattern in patterns:
        paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not paths:
            raise ValueError(f"decontaminate eval {pattern}: no file matches")
        for path in paths:
            name = os.path.basename(path).split(".", 1)[0] or os.path.basename(path)
            name = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
            if name in found and found[name] != path:
                raise ValueError(f"decontaminate eval {path}: a second set named {name!r} "
                                 f"(also {found[name]}); eval sets are named by file stem")
            found[name] = path
    return sorted(found.items())


def _examples(path: str, data: bytes, text_field: str) -> list[str]:
    """The eval examples of one file's bytes, by its suffix."""
    what = "decontaminate eval"
    if not data.strip():
        raise UserFileError(f"{what} {path}: is empty (no eval example)")
    lower = path.lower()
    if lower.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(io.BytesIO(data), columns=[text_field])
        except Exception as exc:  # noqa: BLE001 - ArrowInvalid, KeyError: one line either way
            raise UserFileError(f"{what} {path}: not a Parquet file with a {text_field!r} "
                                f"column ({type(exc).__name__}: {str(exc)[:200]})") from None
        return [t for t in table.column(text_field).to_pylist() if isinstance(t, str)]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{what} {path}: not UTF-8 text (byte {exc.start:,})") from None
    if lower.endswith((".jsonl", ".json", ".ndjson")):
        out = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise UserFileError(f"{what} {path}, line {number}: not JSON "
                                    f"({str(exc)[:120]})") from None
            value = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(value, str):
                raise UserFileError(f"{what} {path}, line {number}: no {text_field!r} "
                                    "string field")
            out.append(value)
        return out
    return [line for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class LoadedIndex:
    index: EvalIndex
    #: each set's name and file content, hashed: what the recipe pins
    sha256: str
    #: set name -> its file as given
    files: dict[str, str]


def load_index(patterns: list[str], n: int, text_field: str = "text") -> LoadedIndex:
    """The index of the eval files ``patterns`` name, with their content hash."""
    pairs = eval_files(patterns)
    digest = hashlib.sha256(f"decontaminate/1 n={n} field={text_field}".encode())
    sets = []
    for name, path in pairs:
        data = read_regular(path, "decontaminate eval", EVAL_FILE_LIMIT)
        digest.update(f"\n{name}\n{len(data)}\n".encode())
        digest.update(hashlib.sha256(data).digest())
        sets.append((name, _examples(path, data, text_field)))
    return LoadedIndex(EvalIndex(sets, n), digest.hexdigest(), dict(pairs))


#: (patterns, n, field) -> (the files' stamps, the index); one entry per distinct step
_INDEXES: dict[tuple[tuple[str, ...], int, str], tuple[tuple[Any, ...], LoadedIndex]] = {}
_LOCK = threading.Lock()


def _stamps(patterns: list[str]) -> tuple[Any, ...]:
    """What identifies the files without reading them (paths, sizes, mtimes): a changed
    file, or a glob that now names another, builds the index again."""
    out: list[Any] = []
    for _, path in eval_files(patterns):
        try:
            st = os.stat(path)
        except OSError:
            return (object(),)  # never equal: reading it says what is wrong
        out.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def cached_index(patterns: list[str], n: int, text_field: str = "text") -> LoadedIndex:
    """:func:`load_index`, once per process while the files are unchanged (a worker builds
    its steps once per task; every task of the run shares the index)."""
    key = (tuple(patterns), n, text_field)
    with _LOCK:
        stamp = _stamps(patterns)
        hit = _INDEXES.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        loaded = load_index(patterns, n, text_field)
        _INDEXES[key] = (stamp, loaded)
        return loaded


class Decontaminate:
    """Drop documents that share word n-grams with evaluation sets (annotate: flag them).

    Options: ``eval`` (files or globs: JSONL, Parquet or text; one set per file, named by its
    stem), ``n`` (words per n-gram, 13), ``min_overlap`` (the share of one eval example's
    n-grams a document must hold; 0: any one n-gram), ``text_field`` (JSONL field or Parquet
    column, ``text``), ``eval_sha256`` (the files' content hash: set by the run, checked on
    every worker). Drops: ``<name>.<set>``.
    """

    name = "decontaminate"
    version = "1"
    modes = MODES
    #: annotate mode's signals (declared: a shard's columns are fixed at its first batch)
    SIGNALS: dict[str, type] = {"hits": int, "overlap": float, "set": str}
    signals: dict[str, type] = SIGNALS

    def __init__(self, eval: list[str], n: int = DEFAULT_N, min_overlap: float = 0.0,
                 text_field: str = "text", eval_sha256: str | None = None,
                 mode: str = "filter") -> None:
        check_options(n, min_overlap)
        if not isinstance(text_field, str) or not text_field:
            raise ValueError(f"decontaminate text_field: a field name, not {text_field!r}")
        self.eval, self.n, self.min_overlap = eval, n, float(min_overlap)
        self.loaded = cached_index(eval, n, text_field)
        if eval_sha256 is not None and eval_sha256 != self.loaded.sha256:
            raise ValueError(f"decontaminate eval files {', '.join(eval)}: their content "
                             f"(sha256 {self.loaded.sha256[:16]}) is not the run's "
                             f"({str(eval_sha256)[:16]}): changed since the run started, or "
                             "not the same files on this worker")
        self.annotate = mode == "annotate"
        self.signals = dict(self.SIGNALS) if self.annotate else {}
        #: set -> documents found; set -> the first REPORT_EXAMPLES of them
        self.found: dict[str, int] = {}
        self.examples: dict[str, list[dict[str, Any]]] = {}

    @classmethod
    def pin_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` with the eval files' content hash (``eval_sha256``), built in the
        driver: the files are checked here (one error naming a bad one) and the recipe in
        the manifest, hence the partition keys, changes with their content. A recipe that
        already pins a hash must match the files."""
        n = options.get("n", DEFAULT_N)
        check_options(n, options.get("min_overlap", 0.0))
        field = options.get("text_field", "text")
        if not isinstance(field, str) or not field:
            raise ValueError(f"decontaminate text_field: a field name, not {field!r}")
        loaded = cached_index(options.get("eval"), n, field)  # type: ignore[arg-type]
        given = options.get("eval_sha256")
        if given is not None and given != loaded.sha256:
            raise ValueError(f"decontaminate eval_sha256 {str(given)[:16]}... is not the eval "
                             f"files' ({loaded.sha256[:16]}...): they changed")
        return {**options, "eval_sha256": loaded.sha256}

    def __call__(self, doc: Doc) -> Doc | tuple[None, str]:
        ws = words(doc.text)
        match = self.loaded.index.match(ws, self.min_overlap)
        if match.set:
            self._note(doc, ws, match.set, match.positions)
        if self.annotate:
            doc.signals["hits"] = match.hits
            doc.signals["overlap"] = match.overlap
            doc.signals["set"] = match.set
            return doc
        if match.set:
            return None, match.set
        return doc

    def _note(self, doc: Doc, ws: list[str], name: str, positions: Any) -> None:
        self.found[name] = self.found.get(name, 0) + 1
        kept = self.examples.setdefault(name, [])
        if len(kept) < REPORT_EXAMPLES:
            grams = []
            for p in positions[:REPORT_NGRAMS * 4]:
                gram = " ".join(ws[int(p):int(p) + self.n])
                if gram not in grams:
                    grams.append(gram)
                if len(grams) == REPORT_NGRAMS:
                    break
            kept.append({"id": doc.id, "source": doc.meta["source"] or doc.id,
                         "ngrams": grams})

    def report(self) -> dict[str, Any]:
        """Per set: documents found and the first :data:`REPORT_EXAMPLES` with their matched
        n-grams (normalised words), in the order the step saw them."""
        return {name: {"documents": count, "examples": list(self.examples.get(name, []))}
                for name, count in sorted(self.found.items())}

