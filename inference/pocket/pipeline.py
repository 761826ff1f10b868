"""LLM text streamed into Piper sentence by sentence: the part that chat turns and duplex share."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from inference.base import OUTPUT_SAMPLE_RATE
from inference.pocket.llm import ChatMessages, GenerationStats, LanguageModel
from inference.pocket.sentences import SentenceSplitter
from inference.pocket.tts import Speaker


@dataclass(slots=True)
class Piece:
    """A text delta (``text``), or one spoken sentence (``sentence`` and its 24 kHz ``audio``)."""

    text: str = ""
    sentence: str = ""
    audio: np.ndarray | None = None


@dataclass(slots=True)
class TurnStats:
    """Timings of one reply, filled in as it is produced."""

    llm: GenerationStats = field(default_factory=GenerationStats)
    llm_s: float = 0.0
    first_token_s: float | None = None
    tts_s: float = 0.0
    tts_audio_s: float = 0.0
    first_audio_s: float | None = None

    def as_metrics(self) -> dict[str, float | int | None]:
        """Flat numbers for step/turn metrics."""
        return {
            "llm_s": round(self.llm_s, 4),
            "llm_prefill_s": round(self.llm.prefill_s, 4),
            "llm_first_token_s": None
            if self.first_token_s is None
            else round(self.first_token_s, 4),
            "llm_input_tokens": self.llm.input_tokens,
            "llm_tokens": self.llm.generated_tokens,
            "tts_s": round(self.tts_s, 4),
            "tts_audio_s": round(self.tts_audio_s, 4),
            "reply_first_audio_s": None
            if self.first_audio_s is None
            else round(self.first_audio_s, 4),
        }


def respond(
    llm: LanguageModel,
    speaker: Speaker | None,
    messages: ChatMessages,
    max_new_tokens: int,
    stats: TurnStats,
    cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[Piece]:
    """Stream the reply: text deltas as tokens come, and (with a speaker) each sentence's audio."""
    start = time.perf_counter()
    splitter = SentenceSplitter()
    tokens = llm.stream(messages, max_new_tokens, stats.llm, cancelled)
    try:
        while True:
            t0 = time.perf_counter()
            delta = next(tokens, None)
            stats.llm_s += time.perf_counter() - t0
            if delta is None:
                break
            if stats.first_token_s is None:
                stats.first_token_s = time.perf_counter() - start
            yield Piece(text=delta)
            if speaker is not None:
                for sentence in splitter.feed(delta):
                    if cancelled():
                        return
                    yield from _speak(speaker, sentence, stats, start)
    finally:
        tokens.close()  # releases the model at once, even when the caller stops early
    if speaker is not None and not cancelled():
        for sentence in splitter.flush():
            yield from _speak(speaker, sentence, stats, start)


def _speak(speaker: Speaker, sentence: str, stats: TurnStats, start: float) -> Iterator[Piece]:
    t0 = time.perf_counter()
    audio = speaker.synthesize(sentence)
    stats.tts_s += time.perf_counter() - t0
    if audio.size:
        stats.tts_audio_s += audio.size / OUTPUT_SAMPLE_RATE
        if stats.first_audio_s is None:
            stats.first_audio_s = time.perf_counter() - start
        yield Piece(sentence=sentence, audio=audio)
