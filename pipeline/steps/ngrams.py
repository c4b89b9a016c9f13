"""Word n-grams for decontamination: the normalisation, the hashes and the eval-set index
(pure: no files, no steps; :mod:`pipeline.steps.decontaminate` reads the eval sets).

**Normalisation** follows datatrove's ``simplify_text`` defaults (what its n-gram
decontamination compares), so a passage is found whatever its case, punctuation, accents or
spacing: lower-case; accents dropped (NFD, combining marks removed); every number (``42``,
``3.14``, ``1,000``) becomes ``0``; every other non-word character (punctuation, symbols,
``_``) becomes a space; words are what whitespace separates. datatrove then splits words with
NLTK's tokenizer; after punctuation is gone that is a whitespace split, save for NLTK's
contractions (none are left once apostrophes are spaces).

**Hashes**: each word gets a 64-bit hash (BLAKE2b, the same in every process, unlike Python's
salted ``hash``); an n-gram's hash is a polynomial of its words' hashes (mod 2^64), finished by
a mixer, computed for every position of a document at once with NumPy. Two different n-grams
share a hash with probability ~2^-64 (1 M eval n-grams against 10^12 document n-grams: ~5e-8
expected false matches in all).

**The index** (:class:`EvalIndex`): every (n-gram hash, eval example) pair, sorted by hash, as
two NumPy arrays (8 + 4 bytes a pair; a Python ``set`` of the same ints costs ~5x as much:
``benchmarks/decontamination.py``), plus each example's n-gram count and set. A document's
distinct n-gram hashes are looked up with one ``searchsorted``.

**Overlap** (``min_overlap``) is a fraction of an *eval example's* n-grams: an example is found
in a document when the document holds at least that share of the example's distinct n-grams
(at least one). 0 (the default) is GPT-3's and datatrove's rule, one shared n-gram; 0.5 asks
for half the example. A fraction of the document's n-grams would make a leaked passage in a
long page look clean, which is the case decontamination exists for.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

#: GPT-3's n (datatrove's default is 12; both are "about a sentence")
DEFAULT_N = 13
#: words whose hashes a process keeps (~170 bytes each: ~5.5 MB), the most recently used
WORD_CACHE = 1 << 15

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NOT_WORD = re.compile(r"[\W_]+")
_COMBINING = re.compile(r"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")

#: the polynomial's base (odd: invertible mod 2^64) and the mixer's constants (splitmix64)
_BASE = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def words(text: str) -> list[str]:
    """The text's words after datatrove's normalisation (see the module's docstring)."""
    text = unicodedata.normalize("NFD", text.lower())
    text = _COMBINING.sub("", text)
    text = _NUMBER.sub("0", text)
    return _NOT_WORD.sub(" ", text).split()


@functools.lru_cache(maxsize=WORD_CACHE)
def _word_hash(w: str) -> bytes:
    return hashlib.blake2b(w.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def word_hashes(ws: Sequence[str]) -> np.ndarray:
    """Each word's 64-bit hash (uint64), the same in every process and on every machine (the
    most frequent words' are cached: a worker hashes "the" once, not once a document)."""
    return np.frombuffer(b"".join(map(_word_hash, ws)), dtype="<u8").astype(np.uint64)


def _mix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(30))
    h = h * _MIX1
    h = h ^ (h >> np.uint64(27))
    h = h * _MIX2
    return h ^ (h >> np.uint64(31))


def ngram_hashes(ws: Sequence[str], n: int) -> np.ndarray:
    """The hash of the n-gram starting at each position (``len(ws) - n + 1`` of them; none
    for fewer than ``n`` words): ``mix(sum(h(w[j+i]) * BASE^(n-1-i)))`` mod 2^64."""
    count = len(ws) - n + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    wh = word_hashes(ws)
    acc = np.zeros(count, dtype=np.uint64)
    for i in range(n):  # Horner's rule, over every position at once (wraps mod 2^64)
        acc = acc * _BASE + wh[i:i + count]
    return _mix(acc)


def ngram_hash(gram: Sequence[str]) -> int:
    """One n-gram's hash, computed word by word in Python: the reference
    :func:`ngram_hashes` is tested against."""
    mask = (1 << 64) - 1
    acc = 0
    for h in word_hashes(gram):
        acc = (acc * int(_BASE) + int(h)) & mask
    return int(_mix(np.array([acc], dtype=np.uint64))[0])


def threshold(n_grams: int, min_overlap: float) -> int:
    """How many of an example's ``n_grams`` a document must hold for the example to be found
    in it: ``min_overlap`` of them, rounded up, and at least one."""
    return max(1, math.ceil(min_overlap * n_grams - 1e-9))


@dataclass(frozen=True)
class Match:
    """What a document shares with the index: ``hits`` (its distinct n-grams found in any
    set), ``overlap`` (the largest share of one example's n-grams it holds), the set that
    contaminates it (``""``: none reaches ``min_overlap``), and the positions of its matched
    n-grams (for the report)."""

    hits: int
    overlap: float
    set: str
    positions: np.ndarray


NO_MATCH = Match(0, 0.0, "", np.empty(0, dtype=np.int64))


class EvalIndex:
    """The eval sets' n-grams: sorted ``(hash, example)`` pairs, each example's distinct
    n-gram count and set. Built from ``(set name, example texts)`` pairs."""

    def __init__(self, sets: Iterable[tuple[str, Iterable[str]]], n: int = DEFAULT_N) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        self.n = n
        self.set_names: list[str] = []
        hashes: list[np.ndarray] = []
        owners: list[np.ndarray] = []
        example_set: list[int] = []
        counts: list[int] = []
        #: examples with fewer than ``n`` words, per set: they have no n-gram to find
        self.short: dict[str, int] = {}
        for s, (name, texts) in enumerate(sets):
            self.set_names.append(name)
            self.short[name] = 0
            for text in texts:
                grams = np.unique(ngram_hashes(words(text), n))
                if not len(grams):
                    self.short[name] += 1
                    continue
                example = len(counts)
                counts.append(len(grams))
                example_set.append(s)
                hashes.append(grams)
                owners.append(np.full(len(grams), example, dtype=np.uint32))
        h = np.concatenate(hashes) if hashes else np.empty(0, dtype=np.uint64)
        e = np.concatenate(owners) if owners else np.empty(0, dtype=np.uint32)
        order = np.lexsort((e, h))
        self.hashes: np.ndarray = h[order]
        self.examples: np.ndarray = e[order]
        self.example_ngrams = np.asarray(counts, dtype=np.uint32)
        self.example_set = np.asarray(example_set, dtype=np.uint16)

    @property
    def nbytes(self) -> int:
        """The index's arrays in bytes (what a worker holds)."""
        return (self.hashes.nbytes + self.examples.nbytes + self.example_ngrams.nbytes
                + self.example_set.nbytes)

    def ngrams_of(self, name: str) -> int:
        """Distinct n-grams of the set ``name`` (an n-gram in two examples counts once)."""
        s = self.set_names.index(name)
        mine = self.example_set[self.examples] == s
        return int(len(np.unique(self.hashes[mine])))

    def examples_of(self, name: str) -> int:
        return int(np.count_nonzero(self.example_set == self.set_names.index(name)))

    def match(self, ws: Sequence[str], min_overlap: float = 0.0) -> Match:
        """What the document of words ``ws`` shares with the eval sets (see :class:`Match`);
        the contaminating set is the one with the most of the document's n-grams among
        those with an example at or past ``min_overlap`` (ties: the first set given)."""
        if not len(self.hashes):
            return NO_MATCH
        doc = ngram_hashes(ws, self.n)
        if not len(doc):
            return NO_MATCH
        unique = np.unique(doc)
        lo = np.searchsorted(self.hashes, unique, "left")
        found = self.hashes[np.minimum(lo, len(self.hashes) - 1)] == unique
        hits = int(np.count_nonzero(found))
        if not hits:  # the usual case: one binary search per n-gram, no second
            return NO_MATCH
        lo, hi = lo[found], np.searchsorted(self.hashes, unique[found], "right")
        spans = hi - lo
        # every (matched n-gram, example) pair: the index rows lo..hi of each matched n-gram
        rows = np.repeat(lo - np.cumsum(spans) + spans, spans) + np.arange(int(spans.sum()))
        examples, shared = np.unique(self.examples[rows], return_counts=True)
        sizes = self.example_ngrams[examples]
        overlap = float((shared / sizes).max())
        need = np.maximum(1, np.ceil(min_overlap * sizes.astype(np.float64) - 1e-9))
        found_sets = self.example_set[examples[shared >= need]]
        positions = np.flatnonzero(np.isin(doc, unique[found]))
        if not len(found_sets):
            return Match(hits, overlap, "", positions)
        # the doc's matched n-grams per contaminating set, each counted once per set
        best, best_hits = -1, -1
        for s in np.unique(found_sets):
            mine = self.example_set[self.examples[rows]] == s
            set_hits = len(np.unique(self.hashes[rows[mine]]))
            if set_hits > best_hits:
                best, best_hits = int(s), set_hits
        return Match(hits, overlap, self.set_names[best], positions)
