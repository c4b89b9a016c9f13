"""Train a fastText quality classifier (DCLM's recipe) from two sets of documents, for the
``fasttext`` step (:class:`pipeline.steps.fasttext_scorer.FastTextScorer`).

DCLM's filter is a supervised fastText model with word bigrams that tells documents like the
positives (``__label__hq``: e.g. instruction data, ELI5 answers) from documents like the
negatives (``__label__lq``: a random sample of the crawl). Here the inputs are read exactly as
``pipeline run`` reads them (the same discovery, partitions and readers; a WARC's HTML through
the same main-text extraction; rejected records skipped), so the model is trained on the text
the step will see.

Memory stays bounded: documents stream into one temporary file of fastText lines (at most
``max_docs`` per class), and only their offsets are shuffled (with ``seed``) to split off the
held-out set and write the training file. With ``threads=1`` fastText's training is
deterministic: the same inputs and seed give the same model.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from array import array
from collections import Counter
from collections.abc import Iterator
from typing import IO, Annotated, Any

import numpy as np
from cyclopts import App, Parameter

from infra.config import StorageOptions

#: the labels written for the two sets (DCLM's names)
POSITIVE, NEGATIVE = "hq", "lq"
LABEL_PREFIX = "__label__"
#: documents between two progress lines
PROGRESS_EVERY = 10_000
#: held-out documents predicted per call
PREDICT_BATCH = 1024
_LABEL_WORD = re.compile(r"(?<!\S)__label__\S*")


# -- reading -------------------------------------------------------------------------------

def read_texts(inputs: list[str], storage_options: dict[str, Any] | None,
               skipped: Counter[str], text_field: str = "text") -> Iterator[str]:
    """The text of every document of ``inputs``, in the order ``pipeline run`` reads them;
    what is left out is counted in ``skipped`` (``rejected``, ``not_html``,
    ``extract_failed``, ``empty``)."""
    from pipeline.planning.discovery import discover_table
    from pipeline.planning.plan import PartitionPlan, auto_partition_bytes
    from pipeline.readers import ReadOptions, read_partition
    from pipeline.records import Rejected

    read = ReadOptions(text_field=text_field)
    with discover_table(inputs, storage_options, None) as table:
        plan = PartitionPlan(table, auto_partition_bytes(table.total_bytes))
        for part in plan:
            for item in read_partition(part, read, storage_options):
                if isinstance(item, Rejected):
                    skipped["rejected"] += 1
                    continue
                text = _text_of(item, skipped)
                if text is not None:
                    yield text


def _text_of(doc: Any, skipped: Counter[str]) -> str | None:
    """A document's text as the pipeline's web steps make it (HTML -> main text; other
    content types left out), ``None`` when there is none."""
    text = doc.text
    if doc.kind.startswith("other"):
        skipped["not_html"] += 1
        return None
    if doc.kind == "html":
        from pipeline.web.extract import html_to_text

        try:
            text = html_to_text(text)
        except Exception:  # a page the parser cannot take, or too complex: as the run does
            skipped["extract_failed"] += 1
            return None
    if not text.strip():
        skipped["empty"] += 1
        return None
    return text


def fasttext_line(label: str, text: str) -> bytes:
    """One training line: ``__label__<label> <text on one line>``. Newlines become spaces,
    as the step does before it predicts; words that fastText would take for labels are
    removed (a document cannot add a label to the model)."""
    line = text.replace("\r", " ").replace("\n", " ")
    if LABEL_PREFIX in line:
        line = _LABEL_WORD.sub(" ", line)
    return f"{LABEL_PREFIX}{label} {line}\n".encode("utf-8", "replace")


class _Lines:
    """The documents' fastText lines in one temporary file, with each line's place."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.offsets = array("q")
        self.lengths = array("q")
        self.labels = array("b")  # 1: positive

    def add(self, line: bytes, positive: bool) -> None:
        self.offsets.append(self.fh.tell())
        self.lengths.append(len(line))
        self.labels.append(int(positive))
        self.fh.write(line)

    def line(self, i: int) -> bytes:
        self.fh.seek(self.offsets[i])
        return self.fh.read(self.lengths[i])


def _collect(lines: _Lines, inputs: list[str], positive: bool, max_docs: int,
             storage_options: dict[str, Any] | None, text_field: str,
             log: IO[str] | None) -> tuple[int, dict[str, int]]:
    """Append up to ``max_docs`` documents of one set; (documents, skipped by reason)."""
    what = "positive" if positive else "negative"
    label = POSITIVE if positive else NEGATIVE
    skipped: Counter[str] = Counter()
    n = 0
    texts = read_texts(inputs, storage_options, skipped, text_field)
    try:
        for text in texts:
            lines.add(fasttext_line(label, text), positive)
            n += 1
            if log is not None and n % PROGRESS_EVERY == 0:
                print(f"train-classifier: {what}: {n:,} documents read", file=log, flush=True)
            if n >= max_docs:
                break
    finally:
        texts.close()  # at the cap: the open input file is closed now, not when collected
    if log is not None:
        more = "".join(f", {v:,} {k}" for k, v in sorted(skipped.items()))
        capped = f" (capped at --max-docs {max_docs:,})" if n >= max_docs else ""
        print(f"train-classifier: {what}: {n:,} documents{capped}{more}", file=log, flush=True)
    if n == 0:
        raise ValueError(f"no documents in the {what} inputs ({', '.join(inputs)})")
    return n, dict(skipped)


# -- splitting and training ----------------------------------------------------------------

def split(labels: np.ndarray, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training order, held-out indices): ``holdout`` of each class held out (rounded, at
    most all but one of its documents), the rest shuffled together; both from ``seed``."""
    rng = np.random.default_rng(seed)
    train, held = [], []
    for value in (1, 0):
        idx = rng.permutation(np.flatnonzero(labels == value))
        k = min(round(len(idx) * holdout), len(idx) - 1)
        held.append(idx[:k])
        train.append(idx[k:])
    return rng.permutation(np.concatenate(train)), np.sort(np.concatenate(held))


def _write_training(lines: _Lines, order: np.ndarray, path: str) -> None:
    with open(path, "wb") as out:
        for i in order:
            out.write(lines.line(int(i)))


def _check(epochs: int, lr: float, word_ngrams: int, dim: int, bucket: int, holdout: float,
           max_docs: int, threads: int) -> None:
    for name, value in (("epochs", epochs), ("word_ngrams", word_ngrams), ("dim", dim),
                        ("bucket", bucket), ("max_docs", max_docs), ("threads", threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not 0 < lr <= 10:
        raise ValueError(f"lr must be in (0, 10], got {lr!r}")
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout must be in [0, 1), got {holdout!r}")


def _local_output(output: str) -> str:
    """The model's path: a local file (fastText writes only local files)."""
    from storage.io.urls import split_protocol

    protocol, path = split_protocol(output)
    if protocol not in (None, "file", "local"):
        raise ValueError(f"output {output}: a local path (fastText writes local files; copy "
                         "the model to a store afterwards)")
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path):
        raise ValueError(f"output {output}: is a directory; name the model file")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


# -- evaluation ----------------------------------------------------------------------------

def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve: the probability that a random positive scores above a
    random negative (ties count one half), from the ranks (Mann-Whitney U); ``None`` without
    both classes."""
    pos = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    _, inverse, counts = np.unique(np.asarray(scores, dtype=np.float64),
                                   return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inverse]  # tied scores share their mean rank
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def precision_recall(scores: np.ndarray, positive: np.ndarray,
                     threshold: float = 0.5) -> tuple[float | None, float | None]:
    """Precision and recall of "positive" when the score is at least ``threshold``
    (``None`` where undefined: nothing predicted positive, or no positives)."""
    pos = np.asarray(positive, dtype=bool)
    predicted = np.asarray(scores) >= threshold
    tp = int((predicted & pos).sum())
    precision = tp / int(predicted.sum()) if predicted.any() else None
    recall = tp / int(pos.sum()) if pos.any() else None
    return precision, recall


def _held_out_scores(model: Any, lines: _Lines, held: np.ndarray) -> np.ndarray:
    """The model's probability of ``hq`` for each held-out document."""
    start = len(LABEL_PREFIX)
    out = np.empty(len(held), dtype=np.float64)
    for lo in range(0, len(held), PREDICT_BATCH):
        batch = held[lo:lo + PREDICT_BATCH]
        texts = [lines.line(int(i)).decode("utf-8").rstrip("\n").split(" ", 1)[1]
                 for i in batch]
        labels, probs = model.predict(texts, k=-1)
        for j, (names, values) in enumerate(zip(labels, probs, strict=True)):
            by = {name[start:]: float(v) for name, v in zip(names, values, strict=True)}
            out[lo + j] = min(1.0, by.get(POSITIVE, 0.0))
    return out


# -- the whole job -------------------------------------------------------------------------

def train_classifier(positive: list[str], negative: list[str], output: str, *,
                     storage_options: dict[str, Any] | None = None, epochs: int = 5,
                     lr: float = 0.1, word_ngrams: int = 2, dim: int = 100,
                     bucket: int = 2_000_000, holdout: float = 0.1, seed: int = 0,
                     max_docs: int = 200_000, threads: int = 1, text_field: str = "text",
                     log: IO[str] | None = None) -> dict[str, Any]:
    """Train a ``hq``/``lq`` fastText model on ``positive`` vs ``negative`` documents (files
    or globs, local or any fsspec URL, any input format of ``pipeline run``), save it to
    ``output`` (a local path) and evaluate it on the held-out documents.

    ``bucket``: the hashed n-gram rows (fastText's default 2,000,000 makes a model of
    ``bucket * dim * 4`` bytes, 800 MB at ``dim=100``, as DCLM's is; a small corpus needs
    far fewer).

    Returns the counts (documents read, trained on and held out per label; records skipped
    by reason), the held-out precision and recall of ``hq`` at 0.5 and ROC AUC (``None``
    when there is no held-out set), and the parameters. Progress lines go to ``log``.
    """
    import fasttext

    _check(epochs, lr, word_ngrams, dim, bucket, holdout, max_docs, threads)
    path = _local_output(output)
    with tempfile.TemporaryDirectory(prefix="train-classifier-") as tmp, \
            open(os.path.join(tmp, "documents.txt"), "w+b") as fh:
        lines = _Lines(fh)
        n_pos, skipped_pos = _collect(lines, positive, True, max_docs, storage_options,
                                      text_field, log)
        n_neg, skipped_neg = _collect(lines, negative, False, max_docs, storage_options,
                                      text_field, log)
        labels = np.frombuffer(lines.labels, dtype=np.int8)
        order, held = split(labels, holdout, seed)
        train_path = os.path.join(tmp, "train.txt")
        _write_training(lines, order, train_path)
        if log is not None:
            print(f"train-classifier: training on {len(order):,} documents "
                  f"({len(held):,} held out)", file=log, flush=True)
        model = fasttext.train_supervised(
            input=train_path, epoch=epochs, lr=lr, wordNgrams=word_ngrams, dim=dim,
            bucket=bucket, seed=seed, thread=threads, minCount=1, loss="softmax", verbose=0)
        model.save_model(path)
        scores = _held_out_scores(model, lines, held)
    truth = labels[held] == 1
    precision, recall = precision_recall(scores, truth)
    held_pos = int(truth.sum())
    return {
        "model": path,
        "documents": {POSITIVE: n_pos, NEGATIVE: n_neg},
        "train": {POSITIVE: n_pos - held_pos, NEGATIVE: n_neg - (len(held) - held_pos)},
        "holdout": {POSITIVE: held_pos, NEGATIVE: len(held) - held_pos},
        "skipped": {"positive": skipped_pos, "negative": skipped_neg},
        "threshold": 0.5,
        "precision": precision,
        "recall": recall,
        "auc": roc_auc(scores, truth),
        "params": {"epochs": epochs, "lr": lr, "word_ngrams": word_ngrams, "dim": dim,
                   "bucket": bucket, "holdout": holdout, "seed": seed, "max_docs": max_docs,
                   "threads": threads, "text_field": text_field},
    }


def report_path(output: str) -> str:
    """Where the command writes the numbers: beside the model, ``MODEL.json``."""
    return f"{output}.json"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def render(result: dict[str, Any]) -> str:
    """The command's summary: counts and the held-out numbers."""
    held = result["holdout"]
    return (f"model      {result['model']}\n"
            f"documents  {result['documents'][POSITIVE]:,} {POSITIVE}, "
            f"{result['documents'][NEGATIVE]:,} {NEGATIVE}\n"
            f"held out   {held[POSITIVE]:,} {POSITIVE}, {held[NEGATIVE]:,} {NEGATIVE}\n"
            f"precision  {_number(result['precision'])} (hq at {result['threshold']})\n"
            f"recall     {_number(result['recall'])}\n"
            f"roc auc    {_number(result['auc'])}")


# -- the command ---------------------------------------------------------------------------

_MANY = Parameter(consume_multiple=True, negative="", metavar="INPUT", show_default=False)


def train_classifier_command(
        *, positive: Annotated[list[str], _MANY],
        negative: Annotated[list[str], _MANY],
        output: Annotated[str, Parameter(metavar="MODEL")],
        storage_options: StorageOptions = None,
        epochs: int = 5, lr: float = 0.1, word_ngrams: int = 2, dim: int = 100,
        bucket: int = 2_000_000, holdout: float = 0.1, seed: int = 0, max_docs: int = 200_000,
        threads: int = 1, text_field: str = "text") -> int:
    """Train a fastText quality classifier (DCLM's) for the fasttext step.

    Read the --positive and --negative documents as `run` reads its inputs, train a
    supervised fastText model (labels hq and lq, word bigrams) on all but a held-out
    part of each, save it to --output, and print the held-out precision and recall of hq
    at 0.5 and the ROC AUC; the numbers are also written to MODEL.json. Flags only: the
    SHARDFLOW_PIPELINE_* variables of `run` (its OUTPUT above all) do not apply.

    Parameters
    ----------
    positive
        files or globs of documents to score high (any input format of `run`)
    negative
        files or globs of documents to score low (e.g. a sample of the crawl)
    output
        where to write the model (a local .bin path)
    epochs
        training epochs
    lr
        learning rate
    word_ngrams
        word n-grams (2: DCLM's bigrams)
    dim
        vector size
    bucket
        hashed word n-gram rows (the model takes bucket x dim x 4 bytes: 800 MB by
        default)
    holdout
        part of each set held out for the evaluation (0: none)
    seed
        seed of the shuffle, the split and fastText
    max_docs
        at most this many documents read per set
    threads
        fastText's threads (1: the same model on every run)
    text_field
        the text's field in JSON lines, CSV and Parquet inputs
    """
    result = train_classifier(
        list(positive), list(negative), output, storage_options=storage_options,
        epochs=epochs, lr=lr, word_ngrams=word_ngrams, dim=dim, bucket=bucket, holdout=holdout,
        seed=seed, max_docs=max_docs, threads=threads, text_field=text_field,
        log=sys.stderr)
    with open(report_path(result["model"]), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
        fh.write("\n")
    print(render(result))
    return 0


def register(app: App) -> None:
    """Add ``train-classifier`` to a cyclopts App (``python -m pipeline``'s: its main runs
    the command and prints an error line for a ``ValueError`` or ``OSError``). No config
    sources: an environment override meant for ``run`` must not name the model's path."""
    app.command(train_classifier_command, name="train-classifier", config=())


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.steps.train_classifier ...``: the command on its own."""
    from infra.config import make_app, parse

    app = make_app("python -m pipeline.steps.train_classifier", component="pipeline",
                   help="Train a fastText quality classifier.")
    register(app)
    args = sys.argv[1:] if argv is None else argv
    command, bound = parse(app, ["train-classifier", *args])
    try:
        rc = command(*bound.args, **bound.kwargs)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return rc if isinstance(rc, int) else 0  # --help returns None


if __name__ == "__main__":
    raise SystemExit(main())
