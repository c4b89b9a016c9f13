"""An exact fast path for byte-level BPE: ``fastokens`` where it reproduces HF ``tokenizers``.

HF ``tokenizers`` is the reference and the fallback. The fast encoder is used for a tokenizer
only when all of these hold:

1. its ``tokenizer.json`` is in the family the fast path is tested on (:func:`unsupported`):
   a BPE model over the 256 byte-level symbols, no normalizer, a byte-level pre-tokenizer with a
   known split pattern (GPT-2's; GPT-4's ``cl100k``, which Llama 3 also uses; GPT-4o's
   ``o200k``), ids equal to merge ranks, no truncation or padding, and added tokens that match
   their literal text only;
2. the ``fastokens`` package imports;
3. a startup self-check passes: a fixed set of hostile probe texts (:data:`PROBES`, plus every
   added token embedded in text) encodes to the same ids with both libraries. If it does not,
   one log line says so and HF does the work.

A batch the fast encoder raises on is encoded again by HF, so errors are HF's too. The ids,
and therefore the shards and the manifest, are the same whichever library ran; setting
``SHARDFLOW_TOKENIZER_ENGINE=hf`` forces HF (a comparison, or a way around a bad fast path).

Why ``fastokens`` (0.3.x): on one thread it encodes GPT-2 many times faster than
``Tokenizer.encode_batch_fast`` on all cores, and faster than ``tiktoken``, with identical ids on
every test here (``benchmarks/pipeline_throughput.py``; figures in benchmarks/README.md), and it
reads ``tokenizer.json`` itself, merges and all, so no vocabulary conversion can drift.
``encode_batch_flat`` returns one buffer of ids plus offsets: no Python object per token or per
document.
"""

from __future__ import annotations

import json
import logging

import numpy as np
from tokenizers import Tokenizer

from infra import environment

log = logging.getLogger(__name__)

#: ``auto`` (default): the fast path where it is exact; ``hf``: always HF ``tokenizers``
ENGINE_ENV = "SHARDFLOW_TOKENIZER_ENGINE"

# The split patterns the fast path is tested with, exactly as they appear in tokenizer.json.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""",
    r"""\s+"""])
KNOWN_PATTERNS = {GPT2_PATTERN: "gpt2", CL100K_PATTERN: "cl100k", O200K_PATTERN: "o200k"}

#: the startup self-check's texts: each kind of input where a reimplementation could drift
PROBES: tuple[str, ...] = (
    "",
    "Hello world! It's a test: we'll see, they've gone, I'm here, you're there, he'd go.",
    "IT'S LOUD, WE'LL SHOUT, THEY'VE GONE; 'tis 'twas rock 'n' roll",
    "Numbers 0 1 12 123 1234 12345 3.14159 1,000,000 -42 +7 1e-9 0x1F ½ ² ٣٤٥ ١٢٣٤ 𝟙𝟚𝟛",
    "tabs\tand\t\ttabs, spaces  two   three    four\n\nnew\r\nlines\rcarriage \n \n  \n",
    " leading space and trailing space ",
    " " * 67 + "x" + "\n" * 9 + "y" + "\t " * 13,
    "\u00a0no-break\u00a0space \u2009thin \u3000ideographic \u2028line\u2029para",
    "zero\u200bwidth \u200c\u200d joiners \ufeffbom \u00adsoft hyphen \U000e0041 tag",
    "control \x00\x01\x07\x1b[31m\x7f\x85 characters",
    "Café naïve coöperate résumé e\u0301 A\u030a ß ẞ İı ǅ ǈ Ω K ﬁ ﬂ",
    "中文文本，日本語のテキスト、한국어 텍스트。",
    "العربية עברית हिन्दी ไทย ქართული Ελληνικά Русский текст",
    "emoji 😀😃 👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷🇯🇵 ❤️ ✔︎ 🏳️\u200d🌈",
    "code: def f(x):\n    return x**2  # comment\n\tif a != b && c >= d: print(\"{}\")",
    "urls https://example.org/a/b?c=d&e=f#g and mail someone@example.com ///",
    "aaaa" * 300,
    "Supercalifragilisticexpialidocious" * 20 + " pneumonoultramicroscopicsilicovolcanoconiosis",
    "!!!???...,,,;;;:::---___===+++***&&&^^^%%%$$$###@@@~~~```|||\\\\\\///",
    "O, that this too too solid flesh would melt,\nThaw and resolve itself into a dew!",
    "mixedCASEWords camelCase snake_case kebab-case SCREAMING_CASE Title Case iPhone McDonald's",
)

# GPT-2's printable stand-ins for the 256 bytes (HF ByteLevel's alphabet)
_BYTE_SYMBOLS = frozenset(
    chr(b) for b in [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                     *range(ord("®"), ord("ÿ") + 1)]) | frozenset(chr(256 + n) for n in range(68))


def unsupported(tok_json: str) -> str | None:
    """Why the fast path cannot be trusted for this tokenizer; ``None`` when it can be."""
    try:
        cfg = json.loads(tok_json)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if cfg.get("normalizer") is not None:
        return "it has a normalizer"
    if cfg.get("truncation") is not None or cfg.get("padding") is not None:
        return "it truncates or pads"
    why = _pre_tokenizer_problem(cfg.get("pre_tokenizer"))
    if why:
        return why
    model = cfg.get("model") or {}
    if model.get("type") != "BPE":
        return f"model {model.get('type')!r} is not BPE"
    if model.get("dropout") not in (None, 0, 0.0):
        return "BPE dropout"
    if model.get("byte_fallback"):
        return "byte fallback"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "subword prefix or suffix"
    vocab: dict[str, int] = model.get("vocab") or {}
    if not _BYTE_SYMBOLS.issubset(vocab):
        return "the vocabulary lacks some of the 256 byte symbols"
    why = _ranks_problem(vocab, model.get("merges") or [])
    if why:
        return why
    for added in cfg.get("added_tokens") or []:
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            return f"added token {added.get('content')!r} strips or matches whole words only"
    return None


def _pre_tokenizer_problem(pre: dict | None) -> str | None:
    def byte_level(step: dict, regex: bool) -> bool:
        return (step.get("type") == "ByteLevel" and not step.get("add_prefix_space")
                and bool(step.get("use_regex", True)) == regex)

    if pre is None:
        return "no pre-tokenizer"
    if byte_level(pre, regex=True):
        return None  # GPT-2's pattern, built into ByteLevel
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2 or not byte_level(steps[1], regex=False):
        return "the pre-tokenizer is not Split + ByteLevel or ByteLevel alone"
    split = steps[0]
    pattern = (split.get("pattern") or {}).get("Regex") if split.get("type") == "Split" else None
    if pattern not in KNOWN_PATTERNS:
        return "the split pattern is not a known one (GPT-2, cl100k, o200k)"
    # these patterns match every character, so keeping the matches (Isolated) and removing
    # what is not matched (inverted Removed) split alike
    if (split.get("behavior"), bool(split.get("invert"))) not in (("Isolated", False),
                                                                  ("Removed", True)):
        return f"split behavior {split.get('behavior')!r} (invert {split.get('invert')})"
    return None


def _ranks_problem(vocab: dict[str, int], merges: list) -> str | None:
    """Each merge's result is in the vocabulary, with ids never falling in the merges' order.

    Equal ids in a row are one token's several merges, as in vocabularies converted from
    tiktoken ranks (Llama 3, GPT-4): every way to split a token into two tokens is a merge.
    """
    first = last = -1
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        got = vocab.get(left + right)
        if got is None or got < last:
            return "ids are not equal to merge ranks"
        first = got if first < 0 else first
        last = got
    if first >= 0 and any(vocab[s] >= first for s in _BYTE_SYMBOLS):
        return "ids are not equal to merge ranks (a byte symbol's id follows a merge's)"
    return None


class FastBPE:
    """``fastokens`` over one tokenizer.json: all documents' ids in one flat array."""

    name = "fastokens"

    def __init__(self, tok_json: str) -> None:
        import fastokens

        self._tok = fastokens.Tokenizer.from_json_str(tok_json)

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(lengths int64, values int32)`` for ``texts``, no special tokens added."""
        ids, offsets = self._tok.encode_batch_flat(texts, add_special_tokens=False)
        ends = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        return np.diff(ends), np.frombuffer(ids, dtype=np.uint32).view(np.int32)


def _self_check(fast: FastBPE, reference: Tokenizer, tok_json: str) -> str | None:
    """The first probe whose ids differ (or the error raised); ``None`` when all agree."""
    added = [t["content"] for t in json.loads(tok_json).get("added_tokens") or []]
    probes = list(PROBES) + [f"a{t}b {t} {t}{t}\n{t}" for t in added]
    want = [e.ids for e in reference.encode_batch(probes, add_special_tokens=False)]
    try:
        lengths, values = fast.encode_flat(probes)
    except Exception as exc:  # noqa: BLE001 - any failure means: do not use it
        return f"it raised {type(exc).__name__}: {exc}"
    got = np.split(values, np.cumsum(lengths)[:-1]) if len(probes) else []
    for text, a, b in zip(probes, want, got, strict=True):
        if a != b.tolist():
            return f"ids differ on {text[:40]!r}"
    return None


def forced_hf() -> bool:
    """``SHARDFLOW_TOKENIZER_ENGINE=hf``: HF ``tokenizers`` encodes everything."""
    return environment.value(ENGINE_ENV).strip().lower() == "hf"


def checked(tok_json: str, reference: Tokenizer) -> FastBPE | None:
    """The fast encoder for ``tok_json`` once it passed the self-check against ``reference``
    (the same tokenizer in HF ``tokenizers``), or ``None`` where HF must do the work."""
    why = unsupported(tok_json)
    if why is not None:
        log.debug("tokenizer: HF tokenizers (no fast path: %s)", why)
        return None
    try:
        fast = FastBPE(tok_json)
    except ImportError:
        log.info("tokenizer: HF tokenizers (fastokens is not installed)")
        return None
    except Exception as exc:  # noqa: BLE001 - a tokenizer.json it cannot read
        log.warning("tokenizer: fast BPE could not load it (%s); using HF tokenizers", exc)
        return None
    failed = _self_check(fast, reference, tok_json)
    if failed is not None:
        log.warning("tokenizer: fast BPE self-check failed (%s); using HF tokenizers", failed)
        return None
    return fast
