"""Words and sentences as the published rules count them, at regex speed.

The Gopher, C4 and FineWeb rules count *words*: datatrove splits English with spaCy's
rule-based tokenizer (whitespace, then punctuation split off the ends of each chunk,
contractions split, a few infixes). :func:`words` follows the same rules with a few regexes and
a per-chunk cache, about 50x faster on web text; where the two can differ (abbreviations
spaCy knows and we do not, non-Latin letter classes, URLs with trailing punctuation) the
difference moves a count by a token or two, which changes a decision only at a threshold's
edge (measured in tests/pipeline/web/test_agreement.py; figures in benchmarks/README.md).

:func:`sentence_count` is spaCy's sentencizer rule on those tokens: a new sentence starts at
a token that is not punctuation and follows a sentence-ending token.
"""

from __future__ import annotations

import functools
import re
import unicodedata

import regex

_QUOTES = "\"'`´“”‘’‚„«»「」『』（）〔〕【】《》〈〉⟦⟧"
_OPEN = "([{<"
_CLOSE = ")]}>"
_PUNCT_CHARS = ",:;!?¿¡؟_#*&。？！，、；：～·।،۔؛٪…"
_CURRENCY = "$£€¥฿₽₴₹₩₪₫₱₺₿"
_UNITS = ("km²|km³|m²|m³|cm²|mm²|km|dm|cm|mm|µm|nm|m|yd|in|ft|kg|mg|µg|g|t|lb|oz|m/s|km/h|kmh"
          "|mph|hPa|Pa|mbar|mb|MB|kb|KB|gb|GB|tb|TB|T|G|M|K|%")
_PREFIX = re.compile("(?:[§%=—–" + re.escape(_CURRENCY + _QUOTES + _OPEN + _CLOSE + _PUNCT_CHARS)
                     + r"]|\.\.+|\+(?![0-9]))")
_SUFFIX = re.compile(
    "(?:[" + re.escape(_QUOTES + _CLOSE + _OPEN + _PUNCT_CHARS + "—–") + r"]|\.\.+|'s|'S|’s|’S"
    r"|(?<=[0-9])\+|(?<=[0-9])[" + re.escape(_CURRENCY) + r"]|(?<=[0-9])(?:" + _UNITS + ")"
    r"|(?<=[0-9a-zß-öø-ÿ%²+\-" + re.escape(_QUOTES + _CLOSE + _OPEN + _PUNCT_CHARS)
    + r"])\.|(?<=[A-ZÀ-ÖØ-Þ][A-ZÀ-ÖØ-Þ])\.)$")
_INFIX = re.compile(
    r"\.\.+|…|(?<=[0-9])[+\-*^](?=[0-9-])|(?<=[a-zß-öø-ÿ])\.(?=[A-ZÀ-ÖØ-Þ])"
    r"|(?<=[^\W\d_]),(?=[^\W\d_])|(?<=[^\W_])(?:---|--|-|–|—)(?=[^\W\d_])"
    r"|(?<=[^\W_])[:<>=/](?=[^\W\d_])")
_URL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/]|www\.)\S+$|^[\w.+-]+@[\w-]+\.[\w.-]+$"
                  r"|^(?:[a-z0-9\u00a1-\uffff][a-z0-9\u00a1-\uffff_-]*\.)+[a-z\u00a1-\uffff]{2,63}"
                  r"(?::\d{2,5})?(?:[/?#]\S*)?$")
_CONTRACTION = re.compile(r"^(.+?)(n't|N'T|n’t|'m|'re|'ve|'ll|'d|'M|'RE|'VE|'LL|'D|’m|’re"
                          r"|’ve|’ll|’d)$")
#: contractions written without their apostrophe ("dont", "Wed", "theyre") that spaCy's
#: English exceptions split: ending -> the words it follows
_BARE = {
    "d": "he how i it that there these they this those we what when where who why you",
    "dve": "he how i it she that there these they this those we what when where who why you",
    "ll": "how it that there these they this those what when where who why you",
    "llve": "he how i it she that there these they this those we what when where who why you",
    "m": "i", "ma": "i", "na": "gon", "not": "can", "ta": "got", "all": "y",
    "nt": "ai are ca could dare did do does had has have is may might must need ought sha "
          "should was were wo would",
    "ntve": "ca could did do does had may might must need ought sha should wo would",
    "re": "how there these they those what when where why you",
    "s": "he how she that there this what when where who why",
    "ve": "could how i might must not should there these they those we what when where who "
          "why would you",
}
_BARE_SPLIT: dict[str, tuple[str, ...]] = {}
for _end, _heads in _BARE.items():
    _tail = (_end[:-2], "ve") if _end.endswith("ve") and len(_end) > 2 else (_end,)
    for _head in _heads.split():
        for _h in (_head, _head.capitalize()):
            _BARE_SPLIT[_h + _end] = (_h, *_tail)
for _n in range(1, 13):
    for _ap in ("am", "pm"):
        _BARE_SPLIT[f"{_n}{_ap}"] = (str(_n), _ap)
#: what spaCy's English exceptions keep whole: abbreviations, single letters with a period,
#: emoticons, a few fixed forms
_SPECIAL_TEXT = """
Adm. Ak. Ala. Apr. Ariz. Ark. Aug. Bros. Calif. Co. Colo. Conn. Corp. D.C. Dec. Del. Dr. E.G.
E.g. Feb. Fla. Ga. Gen. Gov. I.E. I.e. Ia. Id. Ill. Inc. Ind. Jan. Jr. Jul. Jun. Kan. Kans. Ky.
La. Ltd. Mar. Mass. Md. Messrs. Mich. Minn. Miss. Mo. Mont. Mr. Mrs. Ms. Mt. N.C. N.D. N.H.
N.J. N.M. N.Y. Neb. Nebr. Nev. Nov. Oct. Okla. Ore. Pa. Ph.D. Prof. Rep. Rev. S.C. Sen. Sep.
Sept. St. Tenn. Va. Wash. Wis. a.m. co. e.g. i.e. p.m. v.s. vs. ä. ö. ü.
:) :( ): :-) :-( ;) ;-) :D :P :p :o :O :/ :-/ :| :] :} :3 :> :* (: (-: (= (; [: [= =) =( =] =[ =/
=D =| 8) 8-) <3 <33 ^_^ -_- o_o O_O o_O O_o ._. :(( :)) :-)) :-(( :-D :-P :-p :-O :-o :-X :-x
:-| :-] :-} ;D ;-D :') :'( '' C++ and/or w/o o'clock O'clock ma'am Ma'am — ’ ' 'em 'bout 'cause
"""
_SPECIAL = frozenset(_SPECIAL_TEXT.split()) | {f"{c}." for c in "abcdefghijklmnopqrstuvwxyz"}
#: the characters a sentence may end with: Unicode's Sentence_Terminal property
TERMINAL = regex.compile(r"\p{Sentence_Terminal}")
_SENT_END = frozenset("!.?։؟۔܀܁܂߹।॥၊။።፧፨᙮᜵᜶᠃᠉᥄᥅᪨᪩᪪᪫᭚᭛᭞᭟᰻᰼᱾᱿‼‽⁇⁈⁉⸮⸼꓿꘎꘏꛳꛷꡶꡷꣎꣏꤯꧈꧉꩝꩞꩟꫰꫱꯫﹒﹖﹗！．？｡")


@functools.lru_cache(maxsize=1 << 16)
def _split_chunk(chunk: str) -> tuple[str, ...]:
    """The tokens of one whitespace-free chunk: prefixes and suffixes split off until a known
    form (abbreviation, emoticon) or nothing more comes off, then contractions and infixes."""
    prefixes: list[str] = []
    suffixes: list[str] = []
    s = chunk
    while s and s not in _SPECIAL and s not in _BARE_SPLIT:
        m = _PREFIX.match(s)
        if m and m.end() < len(s):
            prefixes.append(m.group())
            s = s[m.end():]
            continue
        m = _SUFFIX.search(s)
        if m and m.start() > 0:
            suffixes.append(m.group())
            s = s[:m.start()]
            continue
        break
    middle: list[str] = []
    if s in _SPECIAL or _URL.match(s):
        middle = [s]
    elif s in _BARE_SPLIT:
        middle = list(_BARE_SPLIT[s])
    elif s:
        c = _CONTRACTION.match(s)
        parts = [c.group(1), c.group(2)] if c else [s]
        for part in parts:
            at = 0
            for m in _INFIX.finditer(part):
                if m.start() > at:
                    middle.append(part[at:m.start()])
                middle.append(m.group())
                at = m.end()
            if at < len(part):
                middle.append(part[at:])
    tokens = [*prefixes, *middle, *reversed(suffixes)]
    # spaCy merges back adjacent pieces that together spell an exception (")" + ":" is "):")
    i = 0
    while i < len(tokens) - 1:
        for n in (3, 2):
            joined = "".join(tokens[i:i + n])
            if len(tokens) - i >= n and joined in _SPECIAL:
                tokens[i:i + n] = [joined]
                break
        else:
            i += 1
    return tuple(tokens)


def words(text: str) -> list[str]:
    """The words (and punctuation tokens) of ``text``, as the rules count them."""
    out: list[str] = []
    split = _split_chunk
    for chunk in text.split():
        if (chunk.isalpha() and chunk not in _BARE_SPLIT) or chunk.isdigit():
            out.append(chunk)
        else:
            out += split(chunk)
    return out


@functools.lru_cache(maxsize=1 << 12)
def _is_punct(token: str) -> bool:
    return all(unicodedata.category(c).startswith("P") for c in token)


def sentence_count(tokens: list[str]) -> int:
    """Sentences in a token list: spaCy's sentencizer (a sentence starts at a non-punctuation
    token after a sentence-ending one); 0 for no tokens."""
    if not tokens:
        return 0
    n, seen_end = 1, False
    for i, tok in enumerate(tokens):
        if seen_end and i and not _is_punct(tok) and tok not in _SENT_END:
            n += 1
            seen_end = False
        elif tok in _SENT_END:
            seen_end = True
    return n


def ends_terminal(line: str) -> bool:
    """Whether the line's last character is a sentence terminal (FineWeb's line rule)."""
    return bool(line) and TERMINAL.match(line[-1]) is not None


#: characters that do not make a word count as a word for Gopher's word-length and word-count
#: rules: punctuation, ASCII symbols and control characters
_SYMBOL_RE = regex.compile(r"^[\p{P}$+<=>^`|~´\x00-\x1f\x7f-\x9f]+$")


def is_symbol_word(word: str) -> bool:
    """Whether a word is made only of punctuation / symbol characters."""
    return not word.isalnum() and _SYMBOL_RE.match(word) is not None
