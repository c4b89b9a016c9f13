"""C4's rules (Raffel et al. 2020, section 2.2, and the TFDS ``c4_utils`` code), as datatrove's
``C4QualityFilter`` applies them: lines without terminal punctuation, with fewer than 3 words,
with a word over 1,000 characters, mentioning "javascript" or a cookie/terms policy are
removed; a page with "lorem ipsum" or a curly bracket, or with fewer than 5 sentences left, is
dropped. Wikipedia-style citation marks are removed. The list of bad words is not applied
(as in datatrove). The rule rewrites the text: what survives is the kept lines.

Filter mode calls the rule set (``__call__`` stops at the first line that drops the page);
annotate mode calls :meth:`C4Quality.measure`, which reads every line and returns the kept
lines with every signal, and :meth:`C4Quality.judge`, which decides from the signals alone:
``judge(measure(text)[1])`` is ``__call__(text)``'s reason for every text, and when the page is
kept ``measure``'s text is ``__call__``'s. Which of "lorem ipsum" and a curly bracket drops a
page is decided by the line where each is first seen, so those signals are line numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from pipeline.web.words import sentence_count, words

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
          "use cookies")


@dataclass(frozen=True)
class C4Quality:
    remove_citations: bool = True
    filter_no_terminal_punct: bool = True
    min_num_sentences: int = 5  # -1: off
    min_words_per_line: int = 3  # -1: off
    max_word_length: int = 1000  # -1: off
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True

    #: ``lorem_ipsum_line`` / ``curly_bracket_line``: the index (in ``text.splitlines()``) of
    #: the first line that reaches that check and matches, -1 for none; they are measured
    #: whether or not the check is on, and the earlier one drops the page (on one line, lorem
    #: ipsum, which is checked first). ``javascript_lines`` / ``policy_lines``: lines removed
    #: for that reason (0 when the check is off); ``lines_removed``: lines not kept, for any
    #: reason; ``n_sentences``: sentences in the kept lines (counted even when the
    #: sentence rule is off).
    SIGNALS: ClassVar[dict[str, type]] = {
        "lines_removed": int, "javascript_lines": int, "policy_lines": int,
        "n_sentences": int, "lorem_ipsum_line": int, "curly_bracket_line": int}

    def signals(self) -> dict[str, type]:
        """The signals :meth:`measure` returns (the same for every configuration)."""
        return dict(self.SIGNALS)

    def __call__(self, text: str) -> tuple[str, str | None]:
        """``(kept lines joined, None)``, or ``(text, reason)`` when the page is dropped."""
        sentences = 0
        kept: list[str] = []
        for raw in text.splitlines():
            line = raw.strip()
            parts = line.split()
            if self.max_word_length != -1 and any(len(w) > self.max_word_length for w in parts):
                continue
            if self.remove_citations and "[" in line:
                line = CITATION.sub("", line)
            if self.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION)
                                                  or line.endswith("...")):
                continue
            if len(parts) < self.min_words_per_line:
                continue
            lowered = line.lower()
            if self.filter_lorem_ipsum and "lorem ipsum" in lowered:
                return text, "lorem_ipsum"
            if self.filter_javascript and "javascript" in lowered:
                continue
            if self.filter_curly_bracket and "{" in line:
                return text, "curly_bracket"
            if self.filter_policy and any(p in lowered for p in POLICY):
                continue
            if self.min_num_sentences != -1:
                sentences += sentence_count(words(line))
            kept.append(line)
        if sentences < self.min_num_sentences:
            return text, "too_few_sentences"
        return "\n".join(kept).strip(), None

    def measure(self, text: str) -> tuple[str, dict[str, int]]:
        """``(kept lines joined, signals)``, for annotate mode: every line is read (no early
        exit). The text is what ``__call__`` returns when it keeps the page; a line with
        "lorem ipsum" or a curly bracket is kept or removed by the line rules alone."""
        raw_lines = text.splitlines()
        kept: list[str] = []
        out = {"lines_removed": 0, "javascript_lines": 0, "policy_lines": 0, "n_sentences": 0,
               "lorem_ipsum_line": -1, "curly_bracket_line": -1}
        for i, raw in enumerate(raw_lines):
            line = self._measure_line(raw, i, out)
            if line is not None:
                out["n_sentences"] += sentence_count(words(line))
                kept.append(line)
        out["lines_removed"] = len(raw_lines) - len(kept)
        return "\n".join(kept).strip(), out

    def _measure_line(self, raw: str, i: int, out: dict[str, int]) -> str | None:
        """The line as kept, or None when a line rule removes it; records in ``out`` the
        page-level matches (line ``i``) and the javascript / policy removals."""
        line = raw.strip()
        parts = line.split()
        if self.max_word_length != -1 and any(len(w) > self.max_word_length for w in parts):
            return None
        if self.remove_citations and "[" in line:
            line = CITATION.sub("", line)
        if self.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION)
                                              or line.endswith("...")):
            return None
        if len(parts) < self.min_words_per_line:
            return None
        lowered = line.lower()
        if out["lorem_ipsum_line"] < 0 and "lorem ipsum" in lowered:
            out["lorem_ipsum_line"] = i
        if self.filter_javascript and "javascript" in lowered:
            out["javascript_lines"] += 1
            return None
        if out["curly_bracket_line"] < 0 and "{" in line:
            out["curly_bracket_line"] = i
        if self.filter_policy and any(p in lowered for p in POLICY):
            out["policy_lines"] += 1
            return None
        return line

    def judge(self, signals: Mapping[str, int]) -> str | None:
        """The reason ``__call__`` gives, decided from :meth:`measure`'s signals alone."""
        drops = []
        if self.filter_lorem_ipsum and signals["lorem_ipsum_line"] >= 0:
            drops.append((signals["lorem_ipsum_line"], 0, "lorem_ipsum"))
        if self.filter_curly_bracket and signals["curly_bracket_line"] >= 0:
            drops.append((signals["curly_bracket_line"], 1, "curly_bracket"))
        if drops:
            return min(drops)[2]
        if signals["n_sentences"] < self.min_num_sentences:
            return "too_few_sentences"
        return None
