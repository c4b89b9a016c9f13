"""A document's text with its word split computed once, shared by the rules that need it."""

from __future__ import annotations

from pipeline.web.words import words


class Text:
    __slots__ = ("_words", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._words: list[str] | None = None

    @property
    def words(self) -> list[str]:
        if self._words is None:
            self._words = words(self.text)
        return self._words
