"""LLM text streamed into Piper clause by clause: the part that chat turns and duplex share.

With a speaker, the LLM runs on its own thread and goes on generating while Piper speaks the
clause it has finished: the first audio waits only for the first clause's tokens and its
synthesis, never for the rest of the reply.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from inference.base import OUTPUT_SAMPLE_RATE
from inference.pocket.llm import ChatMessages, GenerationStats, LanguageModel
from inference.pocket.sentences import SentenceSplitter
from inference.pocket.tts import Speaker

_END = object()  # the LLM thread finished


@dataclass(slots=True)
class Piece:
    """A text delta (``text``), or one spoken clause (``sentence`` and its 24 kHz ``audio``).

    ``sentence`` is the clause's text as the model wrote it, spaces included: the spoken
    clauses' texts, joined, are the reply's text (they go out as the text deltas of speech).
    """

    text: str = ""
    sentence: str = ""
    audio: np.ndarray | None = None


@dataclass(slots=True)
class TurnStats:
    """Timings of one reply, filled in as it is produced (seconds from the reply's start)."""

    llm: GenerationStats = field(default_factory=GenerationStats)
    llm_s: float = 0.0  # the LLM's wall time so far
    first_token_s: float | None = None
    first_clause_s: float | None = None  # the first clause's text is complete
    first_clause_tts_s: float | None = None  # synthesis time of the first clause
    tts_s: float = 0.0
    tts_audio_s: float = 0.0
    first_audio_s: float | None = None

    def as_metrics(self) -> dict[str, float | int | None]:
        """Flat numbers for step/turn metrics."""

        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 4)

        return {
            "llm_s": r(self.llm_s),
            "llm_prefill_s": r(self.llm.prefill_s),
            "llm_first_token_s": r(self.first_token_s),
            "llm_first_clause_s": r(self.first_clause_s),
            "llm_input_tokens": self.llm.input_tokens,
            "llm_tokens": self.llm.generated_tokens,
            "tts_s": r(self.tts_s),
            "tts_first_clause_s": r(self.first_clause_tts_s),
            "tts_audio_s": r(self.tts_audio_s),
            "reply_first_audio_s": r(self.first_audio_s),
        }


def respond(
    llm: LanguageModel,
    speaker: Speaker | None,
    messages: ChatMessages,
    max_new_tokens: int,
    stats: TurnStats,
    cancelled: Callable[[], bool] = lambda: False,
    first_clause_priority: bool = True,
) -> Iterator[Piece]:
    """Stream the reply: text deltas as tokens come, and (with a speaker) each clause's audio.

    ``first_clause_priority``: the LLM pauses while Piper synthesizes the first clause (on two
    cores, running both at once makes the first audio later); it goes on during playback.
    """
    start = time.perf_counter()
    if speaker is None:
        for delta in llm.stream(messages, max_new_tokens, stats.llm, cancelled):
            if stats.first_token_s is None:
                stats.first_token_s = time.perf_counter() - start
            stats.llm_s = time.perf_counter() - start
            yield Piece(text=delta)
        stats.llm_s = time.perf_counter() - start
        return
    deltas: queue.Queue[object] = queue.Queue()
    stop = threading.Event()
    gate = threading.Event()
    gate.set()
    thread = threading.Thread(
        target=_generate,
        args=(
            llm,
            messages,
            max_new_tokens,
            stats,
            lambda: stop.is_set() or cancelled(),
            deltas,
            gate,
        ),
        name="pocket-llm",
        daemon=True,
    )
    thread.start()
    splitter = SentenceSplitter()
    unspoken = ""  # text Piper had nothing to say for: it rides on the next clause's audio
    try:
        while True:
            item = deltas.get()
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            delta = str(item)
            if stats.first_token_s is None:
                stats.first_token_s = time.perf_counter() - start
            yield Piece(text=delta)
            for sentence in splitter.feed(delta):
                if cancelled():
                    return
                if first_clause_priority and stats.first_clause_s is None:
                    gate.clear()
                try:
                    piece = _speak(speaker, unspoken + sentence, stats, start)
                finally:
                    gate.set()
                unspoken = "" if piece is not None else unspoken + sentence
                if piece is not None:
                    yield piece
        if not cancelled():
            for sentence in splitter.flush():
                piece = _speak(speaker, unspoken + sentence, stats, start)
                unspoken = "" if piece is not None else unspoken + sentence
                if piece is not None:
                    yield piece
            if unspoken.strip():  # its text still goes out, with no audio
                yield Piece(sentence=unspoken, audio=np.zeros(0, dtype=np.float32))
    finally:
        stop.set()  # the caller stopped early, or the reply is done: release the model
        gate.set()
        thread.join()


def _generate(
    llm: LanguageModel,
    messages: ChatMessages,
    max_new_tokens: int,
    stats: TurnStats,
    cancelled: Callable[[], bool],
    out: queue.Queue[object],
    gate: threading.Event,
) -> None:
    """The LLM thread: text deltas onto ``out``, then ``_END`` (or the exception, then _END)."""
    start = time.perf_counter()
    try:
        for delta in llm.stream(messages, max_new_tokens, stats.llm, cancelled, gate):
            stats.llm_s = time.perf_counter() - start
            out.put(delta)
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer
        out.put(exc)
    finally:
        stats.llm_s = time.perf_counter() - start
        out.put(_END)


def _speak(speaker: Speaker, sentence: str, stats: TurnStats, start: float) -> Piece | None:
    if stats.first_clause_s is None:
        stats.first_clause_s = time.perf_counter() - start
    t0 = time.perf_counter()
    audio = speaker.synthesize(sentence.strip())
    spent = time.perf_counter() - t0
    stats.tts_s += spent
    if stats.first_clause_tts_s is None:
        stats.first_clause_tts_s = spent
    if audio.size:
        stats.tts_audio_s += audio.size / OUTPUT_SAMPLE_RATE
        if stats.first_audio_s is None:
            stats.first_audio_s = time.perf_counter() - start
        return Piece(sentence=sentence, audio=audio)
    return None
