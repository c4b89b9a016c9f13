"""A fastText classifier's label probabilities as signals (DCLM's quality filter, or any
supervised fastText model): ``<name>.hq``, ``<name>.lq``, ... (``<name>``: the recipe entry's).

The model is read once per process (:func:`cached_model`: a worker or isolation child builds
its steps once, and every step built with the same model shares it), from a local path or any
fsspec URL (fetched once to a local temporary file: fastText and KenLM read only local
files). The step annotates: it drops nothing; a recipe filters on the signal downstream, or a
threshold is chosen from the scores of a run.

The Python module is ``fasttext``, from the ``fasttext-community`` wheel (the official
``fasttext`` 0.9.3 has no wheels and its ``predict`` fails under NumPy 2:
``np.array(copy=False)``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from infra.user_files import not_regular
from pipeline.steps.contract import Doc
from storage import display_url, resolve

#: fastText's default label prefix (``-label``); a model may have another (its args say)
LABEL_PREFIX = "__label__"

#: (kind, model URL) -> (stamp, loaded model, temporary copy or None); one entry per model
_MODELS: dict[tuple[str, str], tuple[tuple[Any, ...], Any, str | None]] = {}
#: one load at a time: the threads of a worker building the same step wait for the first
_LOCK = threading.Lock()


def _stamp(loc: Any, model: str, what: str) -> tuple[Any, ...]:
    """What identifies the model file's content without reading it: size and mtime (local),
    size and ETag or modification time (remote). A changed file is loaded again."""
    shown = display_url(model)
    if loc.is_local:
        try:
            kind = not_regular(loc.root)
            st = os.stat(loc.root)
        except OSError as exc:
            raise ValueError(f"{what} model {shown}: cannot read "
                             f"({exc.strerror or type(exc).__name__})") from None
        if kind is not None:
            raise ValueError(f"{what} model {shown}: is {kind}, not a model file")
        return (st.st_size, st.st_mtime_ns, st.st_ino)
    try:
        info = loc.fs.info(loc.root)
    except FileNotFoundError:
        raise ValueError(f"{what} model {shown}: no such file") from None
    except OSError as exc:
        raise ValueError(f"{what} model {shown}: cannot read ({exc})") from None
    if info.get("type") == "directory":
        raise ValueError(f"{what} model {shown}: is a directory, not a model file")
    version = (info.get("ETag") or info.get("etag") or info.get("e_tag")
               or info.get("LastModified") or info.get("mtime") or info.get("last_modified"))
    return (info.get("size"), str(version))


def _fetch(loc: Any, model: str, what: str) -> str:
    """A local temporary copy of a remote model (removed when the process exits or the model
    is replaced)."""
    suffix = "-" + os.path.basename(loc.root.rstrip("/"))[-64:]
    fd, path = tempfile.mkstemp(prefix="shardflow-model-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as out, loc.fs.open(loc.root, "rb") as src:
            shutil.copyfileobj(src, out, 4 << 20)
    except BaseException as exc:
        os.unlink(path)
        if isinstance(exc, OSError):
            raise ValueError(f"{what} model {display_url(model)}: cannot read ({exc})") from None
        raise
    return path


def _remove(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


@atexit.register
def _cleanup() -> None:
    for _, _, temporary in _MODELS.values():
        _remove(temporary)


def cached_model(model: str, storage_options: dict[str, Any] | None, what: str,
                 load: Callable[[str], Any]) -> Any:
    """``load(local path)`` of ``model``, once per process while the file is unchanged.

    ``what`` names the kind of model in errors and in the cache key (a fastText and a KenLM
    step never share an entry). Every error is a ``ValueError`` naming the model as given
    (the registry reports it as the step's: one line, not a traceback per task)."""
    try:
        loc = resolve(model, storage_options)
    except (ImportError, ValueError) as exc:  # unknown protocol, malformed URL
        raise ValueError(f"{what} model {display_url(model)}: {exc}") from None
    key = (what, loc.url)
    with _LOCK:
        stamp = _stamp(loc, model, what)
        hit = _MODELS.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        temporary = None if loc.is_local else _fetch(loc, model, what)
        try:
            loaded = load(temporary or loc.root)
        except BaseException:
            _remove(temporary)
            raise
        if hit is not None:
            _remove(hit[2])
        _MODELS[key] = (stamp, loaded, temporary)
        return loaded


def _load_fasttext(model: str) -> Callable[[str], Any]:
    """A loader for :func:`cached_model` whose errors name ``model`` (not a temporary
    copy's path)."""

    def load(path: str) -> Any:
        import fasttext

        try:
            loaded = fasttext.load_model(path)
        except ValueError as exc:  # "has wrong file format!", "cannot be opened"
            reason = str(exc).replace(path, "").strip(" !") or type(exc).__name__
            raise ValueError(f"fasttext model {display_url(model)}: not a fastText model "
                             f"({reason})") from None
        if not _supervised(loaded):
            raise ValueError(f"fasttext model {display_url(model)}: not a supervised "
                             "fastText model (it has no labels)")
        return loaded

    return load


def _supervised(loaded: Any) -> bool:
    """Whether a loaded model is a classifier (a word-vector model has no labels: its
    ``get_labels`` lists words)."""
    try:
        return loaded.f.getArgs().model.name == "supervised"
    except AttributeError:  # a binding without getArgs: predict will tell
        return bool(loaded.get_labels())


def label_prefix(loaded: Any) -> str:
    """The model's label prefix (``-label`` when it was trained; ``__label__`` by default)."""
    try:
        return str(loaded.f.getArgs().label) or LABEL_PREFIX
    except AttributeError:  # a binding without getArgs
        return LABEL_PREFIX


def _keys(labels: list[str], prefix: str) -> dict[str, str]:
    """Model label -> signal key (the label without its prefix)."""
    return {label: label[len(prefix):] if label.startswith(prefix) else label
            for label in labels}


def _chosen(keys: dict[str, str], wanted: list[str] | None, model: str) -> dict[str, str]:
    """The labels to write (all, or those of ``wanted``, given with or without the prefix)."""
    if wanted is None:
        return keys
    if isinstance(wanted, str) or not wanted:
        raise ValueError(f"fasttext labels: a non-empty list of labels, got {wanted!r}")
    by_key = {key: label for label, key in keys.items()}
    out: dict[str, str] = {}
    for name in wanted:
        label = name if name in keys else by_key.get(name)
        if label is None:
            raise ValueError(f"fasttext model {display_url(model)} has no label {name!r} "
                             f"(its labels: {', '.join(sorted(by_key))})")
        out[label] = keys[label]
    return out


def _check_k(k: int | None) -> int:
    if k is None:
        return -1
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"fasttext k: a positive number of labels, got {k!r}")
    return k


class FastTextScorer:
    """Write the probability of each label of a supervised fastText model as a float signal.

    Options: ``model`` (a local path or fsspec URL of a ``.bin`` model), ``labels`` (the
    labels to write, with or without the ``__label__`` prefix; default all), ``k`` (predict
    only the ``k`` most probable labels: the other written labels get ``0.0``, so a shard's
    columns do not depend on a document; default all labels), ``storage_options`` (the run's,
    for a remote model). Signals: one per written label, keyed by the label without its
    prefix (``hq``, ``lq`` for DCLM's model), in ``[0, 1]``.
    """

    name = "fasttext"
    version = "1"
    wants_storage_options = True

    def __init__(self, model: str, labels: list[str] | None = None, k: int | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"fasttext model: a path or URL, got {model!r}")
        self.model = model
        self.k = _check_k(k)
        self._model = cached_model(model, storage_options, "fasttext", _load_fasttext(model))
        prefix = label_prefix(self._model)
        self._keys = _chosen(_keys(list(self._model.get_labels()), prefix), labels, model)
        #: every written key, declared: the shard's columns are fixed at its first batch
        self.signals: dict[str, type] = {key: float for key in self._keys.values()}

    def scores(self, text: str) -> dict[str, float]:
        """Signal key -> probability of the text (on one line: fastText's predict refuses
        newlines; words are split on whitespace either way)."""
        return self.scores_of([text])[0]

    def scores_of(self, texts: list[str]) -> list[dict[str, float]]:
        """:meth:`scores` of each text, in one ``predict`` call (fastText predicts a list of
        lines in C++, without a Python round trip per document)."""
        lines = [text.replace("\n", " ") for text in texts]
        try:
            labels, probs = self._model.predict(lines, k=self.k, on_unicode_error="replace")
        except TypeError:  # lone surrogates: not UTF-8, so pybind11 refuses the str
            lines = [line.encode("utf-8", "replace").decode("utf-8") for line in lines]
            labels, probs = self._model.predict(lines, k=self.k, on_unicode_error="replace")
        return [self._named(ls, ps) for ls, ps in zip(labels, probs, strict=True)]

    def _named(self, labels: Any, probs: Any) -> dict[str, float]:
        out = dict.fromkeys(self._keys.values(), 0.0)
        for label, prob in zip(labels, probs, strict=True):
            key = self._keys.get(label)
            if key is not None:  # fastText adds 1e-5 before its log: clip to a probability
                out[key] = min(1.0, max(0.0, float(prob)))
        return out

    def __call__(self, doc: Doc) -> Doc:
        doc.signals.update(self.scores(doc.text))
        return doc

    def batch(self, docs: list[Doc]) -> list[Doc]:
        """:meth:`__call__` on each document, scored in one call (see :meth:`scores_of`)."""
        for doc, scores in zip(docs, self.scores_of([d.text for d in docs]), strict=True):
            doc.signals.update(scores)
        return docs
