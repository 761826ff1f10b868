"""One spoken reply of a duplex session: generated on a background thread, handed out in pieces.

The thread runs ``pipeline.respond`` (LLM -> clauses -> Piper) and queues each spoken clause;
the session's steps take <= 1 s of audio at a time. A reply can start before it is wanted (a
speculative start while the user pauses) and be cancelled at any point without blocking.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from inference.base import OUTPUT_SAMPLE_RATE, InferenceError
from inference.pocket.llm import ChatMessages
from inference.pocket.models import PocketModels
from inference.pocket.pipeline import TurnStats, respond

_DONE = object()  # end of a reply on the queue
TAIL = OUTPUT_SAMPLE_RATE // 10  # audio the first piece may keep back (see ``take``)


class Reply:
    """A reply being generated for ``messages``; its thread starts at construction."""

    def __init__(self, backend: PocketModels, messages: ChatMessages, prompt_tokens: int) -> None:
        self.messages = messages
        self.prompt_tokens = prompt_tokens
        self.stats = TurnStats()
        self.cancel = threading.Event()
        self.spoken: list[str] = []  # clause texts handed out so far
        self.first_audio_at: float | None = None  # perf_counter when the first clause was ready
        self.finished = False
        self._b = backend
        self._out: queue.Queue[Any] = queue.Queue()
        self._pending: deque[list[Any]] = deque()  # [text, audio] not yet handed out
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._generate, name="pocket-reply", daemon=True)
        self._thread.start()

    @property
    def generated_tokens(self) -> int:
        return self.stats.llm.generated_tokens

    def _generate(self) -> None:
        """The thread: LLM tokens -> clauses -> speech, onto the queue."""
        try:
            for piece in respond(
                self._b.llm,
                self._b.speaker,
                self.messages,
                self._b.duplex_max_new_tokens,
                self.stats,
                self.cancel.is_set,
                first_clause_priority=self._b.first_clause_priority,
            ):
                if piece.audio is not None:
                    if self.first_audio_at is None and piece.audio.size:
                        self.first_audio_at = time.perf_counter()
                    self._out.put((piece.sentence, piece.audio))
        except BaseException as exc:  # noqa: BLE001 - handed to the step thread
            self._error = exc
        finally:
            self._out.put(_DONE)

    def _next(self, wait: bool) -> bool | None:
        """Move the next clause (or the end) into ``_pending``.

        True: a clause came; False: the reply is over; None: nothing yet (only if not ``wait``).
        """
        if self.finished:
            return False
        try:
            if wait:
                item = self._out.get(timeout=self._b.first_audio_timeout_s)
            else:
                item = self._out.get_nowait()
        except queue.Empty:
            if not wait:
                return None
            self.cancel.set()
            raise InferenceError("the pocket reply took too long") from None
        if item is _DONE:
            self.finished = True
            if self._error is not None:
                raise InferenceError(f"pocket reply failed: {self._error}") from self._error
            return False
        self._pending.append(list(item))
        return True

    def take(self, first: bool) -> tuple[str, np.ndarray, bool]:
        """The next <= 1 s: (text of the clause it starts, audio, whether it is the last piece).

        Waits for the next clause when none is ready. Whether a piece is the last is known by
        looking ahead: later pieces wait for the next clause or the end; the first piece never
        does (it would delay the first audio by a whole clause) and, when it cannot tell, keeps
        its last ``TAIL`` samples back, so the end of the turn always rides on audio.
        """
        if not self._pending:
            self._next(wait=True)
        text, audio, last = "", np.zeros(0, dtype=np.float32), False
        if self._pending:
            head = self._pending[0]
            size = OUTPUT_SAMPLE_RATE
            if first and len(self._pending) == 1 and head[1].size <= size:
                ahead = self._next(wait=False)
                if ahead is None:
                    size = max(0, head[1].size - TAIL)
                last = ahead is False
            text, head[0] = head[0], ""
            audio, head[1] = head[1][:size], head[1][size:]
            if text:
                self.spoken.append(text)
            if not head[1].size:
                self._pending.popleft()
        if not first:
            last = not self._pending and not self._next(wait=True)
        return text, audio, last

    def stop(self, wait: bool = True) -> None:
        """Cancel; ``wait``: until the thread has let go of the models (bounded)."""
        self.cancel.set()
        self._pending.clear()
        if wait:
            self._thread.join(timeout=30)
