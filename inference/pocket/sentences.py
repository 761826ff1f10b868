"""Cutting a stream of text deltas into sentences, so speech can start before the reply ends.

The first clause is cut shorter than a sentence: the first audio waits for its tokens and for
Piper to synthesize all of it, which takes longer the more words it has. It ends at a comma, or
before a word that opens a new phrase ("that", "and", "because", ...), once it has a few words;
at ``first_clause_max_words`` it is cut at the last space.

Pieces are slices of the text as it came, spaces and newlines included: joined, they give back
the text (less any whitespace it ends with), so they can go out as text deltas; a piece's
speech is synthesized from it stripped.
"""

from __future__ import annotations

import re

_END = re.compile(r"(?<=[.!?;:])[\"')\]]*\s+|\n+")
_LIST_MARK = re.compile(r"\s*(\d{1,3}|[a-zA-Z])[.)]\s*")  # "1. " starts an item, ends nothing
# words before which a spoken phrase boundary falls; only followed by a space (a whole word)
_PHRASE = re.compile(
    r"\s(?=(?:that|which|who|whose|where|when|while|because|and|but|so|or|with|if|as)\s)",
    re.IGNORECASE,
)


class SentenceSplitter:
    """Feed text deltas; get back each sentence as soon as it is complete."""

    def __init__(
        self, max_chars: int = 160, first_clause_words: int = 4, first_clause_max_words: int = 12
    ) -> None:
        self._buffer = ""
        self._max_chars = max_chars
        self._first_clause_words = first_clause_words  # 0: never cut the first sentence early
        self._first_clause_max_words = first_clause_max_words
        self._started = False

    def feed(self, delta: str) -> list[str]:
        """Add a delta; return the pieces it completed (none of them only whitespace)."""
        self._buffer += delta
        out: list[str] = []
        pos = 0
        while True:
            match = _END.search(self._buffer, pos)
            if match is None:
                break
            head = self._buffer[: match.end()]
            if not head.strip() or _LIST_MARK.fullmatch(head):
                pos = match.end()  # blank lines, or a list item's number: keep them with the text
                continue
            out.append(head)
            self._buffer = self._buffer[match.end() :]
            pos = 0
        if not out and not self._started and self._first_clause_words:
            cut = self._first_clause_cut()
            if cut > 0:
                out.append(self._buffer[:cut])
                self._buffer = self._buffer[cut:]
        if len(self._buffer) > self._max_chars:  # a run-on: cut after the last space
            cut = self._buffer.rfind(" ", 0, self._max_chars)
            if cut > 0 and self._buffer[:cut].strip():
                out.append(self._buffer[: cut + 1])
                self._buffer = self._buffer[cut + 1 :]
        self._started = self._started or bool(out)
        return out

    def _first_clause_cut(self) -> int:
        """Where the first clause may end in the buffer (0: not yet)."""
        enough = self._first_clause_words
        comma = self._buffer.find(", ")
        while comma > 0:
            if len(self._buffer[:comma].split()) >= enough:
                return comma + 2
            comma = self._buffer.find(", ", comma + 1)
        for match in _PHRASE.finditer(self._buffer):
            if len(self._buffer[: match.start()].split()) > enough:
                return match.end()
        words = self._buffer.split(" ")
        if len(words) > self._first_clause_max_words + 1:  # the last one may be unfinished
            return len(" ".join(words[: self._first_clause_max_words])) + 1
        return 0

    def flush(self) -> list[str]:
        """The unfinished rest, as a last piece (none if it is only whitespace)."""
        rest, self._buffer = self._buffer, ""
        return [rest] if rest.strip() else []
