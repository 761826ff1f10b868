"""Cutting a stream of text deltas into sentences, so speech can start before the reply ends."""

from __future__ import annotations

import re

_END = re.compile(r"(?<=[.!?;:])[\"')\]]*\s+|\n+")
_LIST_MARK = re.compile(r"\s*(\d{1,3}|[a-zA-Z])[.)]\s*")  # "1. " starts an item, ends nothing


class SentenceSplitter:
    """Feed text deltas; get back each sentence as soon as it is complete."""

    def __init__(self, max_chars: int = 160, first_clause_words: int = 6) -> None:
        self._buffer = ""
        self._max_chars = max_chars
        self._first_clause_words = first_clause_words  # 0: never cut the first sentence early
        self._started = False

    def feed(self, delta: str) -> list[str]:
        """Add a delta; return the sentences it completed."""
        self._buffer += delta
        out: list[str] = []
        pos = 0
        while True:
            match = _END.search(self._buffer, pos)
            if match is None:
                break
            if _LIST_MARK.fullmatch(self._buffer[: match.end()]):
                pos = match.end()  # a list item's number: keep it with the item's text
                continue
            sentence, self._buffer = (
                self._buffer[: match.end()].strip(),
                self._buffer[match.end() :],
            )
            pos = 0
            if sentence:
                out.append(sentence)
        if not out and not self._started and self._first_clause_words:
            # The first sentence may be cut at a comma, so that speech starts sooner.
            comma = self._buffer.find(", ")
            if comma > 0 and len(self._buffer[:comma].split()) >= self._first_clause_words:
                out.append(self._buffer[: comma + 1].strip())
                self._buffer = self._buffer[comma + 2 :]
        if len(self._buffer) > self._max_chars:  # a run-on: cut at the last comma or space
            cut = max(
                self._buffer.rfind(", ", 0, self._max_chars),
                self._buffer.rfind(" ", 0, self._max_chars),
            )
            if cut > 0:
                out.append(self._buffer[: cut + 1].strip())
                self._buffer = self._buffer[cut + 1 :]
        self._started = self._started or bool(out)
        return out

    def flush(self) -> list[str]:
        """The unfinished rest, as a last sentence."""
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []
