"""C4's rules (Raffel et al. 2020, section 2.2, and the TFDS ``c4_utils`` code), as datatrove's
``C4QualityFilter`` applies them: lines without terminal punctuation, with fewer than 3 words,
with a word over 1,000 characters, mentioning "javascript" or a cookie/terms policy are
removed; a page with "lorem ipsum" or a curly bracket, or with fewer than 5 sentences left, is
dropped. Wikipedia-style citation marks are removed. The list of bad words is not applied
(as in datatrove). The rule rewrites the text: what survives is the kept lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
