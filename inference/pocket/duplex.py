"""Duplex voice sessions for the pocket backend: VAD turns, a reply thread, ~1 s speech steps.

States: listening (waiting for speech) -> hearing (buffering the utterance) -> speaking (the
reply is generated on a background thread, sentence by sentence, and handed out in <= 1 s
pieces, one per step). Voiced input while speaking (barge-in), ``force_listen`` or
``interrupt()`` stop the reply at once; the part already spoken stays in the history.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from inference.base import (
    INPUT_SAMPLE_RATE,
    OUTPUT_SAMPLE_RATE,
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    DuplexStep,
    InferenceError,
)
from inference.pocket.asr import SpeechRecognizer
from inference.pocket.llm import ChatMessages, LanguageModel
from inference.pocket.pipeline import TurnStats, respond
from inference.pocket.tts import Speaker
from inference.pocket.vad import EnergyVAD


class PocketModels(Protocol):
    """What a duplex session uses of its backend: the loaded models and the session options.

    (``PocketBackend`` is one; naming the needs here keeps this module below backend.py, which
    imports it, instead of the two importing each other.)
    """

    asr: SpeechRecognizer
    llm: LanguageModel
    speaker: Speaker
    vad: EnergyVAD
    system_prompt: str
    barge_in: bool
    silence_chunks: int
    max_utterance_s: float
    max_history_tokens: int
    duplex_max_new_tokens: int
    first_audio_timeout_s: float


_DONE = object()  # end of a reply on the reply queue


@dataclass(slots=True)
class _Reply:
    """One assistant turn being generated on a background thread."""

    stats: TurnStats = field(default_factory=TurnStats)
    out: queue.Queue[Any] = field(default_factory=queue.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    pending: deque = field(default_factory=deque)  # [text, audio] not yet handed out
    spoken: list[str] = field(default_factory=list)
    finished: bool = False
    error: BaseException | None = None
    thread: threading.Thread | None = None
    prompt_tokens: int = 0


class PocketDuplexSession(DuplexSession):
    """One voice conversation with history, over the backend's loaded models."""

    def __init__(self, backend: PocketModels) -> None:
        self._b = backend
        self._system_prompt = backend.system_prompt
        self._history: ChatMessages = []
        self._kv = 0
        self._heard: list[np.ndarray] = []
        self._preroll: np.ndarray | None = None
        self._silent_after_speech = 0
        self._reply: _Reply | None = None
        self._interrupt = threading.Event()
        self._frames_total = 0
        self._closed = False

    # ------------------------------------------------------------------ interface

    def prepare(self, config: DuplexConfig) -> int:
        """Start a fresh conversation; ``config.system_prompt`` replaces the default one."""
        self._stop_reply()
        self._system_prompt = config.system_prompt.strip() or self._b.system_prompt
        self._history = []
        self._heard, self._preroll, self._silent_after_speech = [], None, 0
        self._interrupt.clear()
        self._kv = self._b.llm.count_tokens(self._messages())
        return self._kv

    def interrupt(self) -> None:
        """Stop speaking at once; the next step listens."""
        self._interrupt.set()
        if self._reply is not None:
            self._reply.cancel.set()

    def close(self) -> None:
        """Stop any reply and drop all conversation state."""
        self._stop_reply()
        self._history, self._heard, self._preroll = [], [], None
        self._kv = 0
        self._closed = True

    def step(self, chunk: DuplexInput) -> DuplexStep:
        """Consume ~1 s of input; listen, or hand out the next <= 1 s of the reply."""
        if self._closed:
            raise InferenceError("the duplex session is closed")
        started = time.perf_counter()
        audio = np.asarray(chunk.audio, dtype=np.float32).reshape(-1)
        self._frames_total += len(chunk.frames)
        ratio = self._b.vad.voiced_ratio(audio)
        voiced = ratio >= self._b.vad.min_voiced_ratio
        metrics: dict[str, Any] = {
            "vad_voiced_ratio": round(ratio, 3),
            "vision_frames": len(chunk.frames),
            "vision_frames_total": self._frames_total,
        }
        forced = chunk.force_listen or self._interrupt.is_set()
        self._interrupt.clear()
        if self._reply is not None and (forced or (voiced and self._b.barge_in)):
            metrics["interrupted"] = "force_listen" if forced else "barge_in"
            self._stop_reply()
        if self._reply is not None:
            result = self._speak(metrics)
        else:
            result = self._listen(audio, voiced, metrics)
        result.metrics["step_s"] = round(time.perf_counter() - started, 4)
        return result

    # ------------------------------------------------------------------ listening

    def _listen(self, audio: np.ndarray, voiced: bool, metrics: dict[str, Any]) -> DuplexStep:
        if voiced:
            if not self._heard and self._preroll is not None:
                self._heard.append(self._preroll)  # a soft onset may sit in the chunk before
            self._heard.append(audio)
            self._silent_after_speech = 0
        elif self._heard:
            self._heard.append(audio)
            self._silent_after_speech += 1
        self._preroll = None if voiced else audio
        heard_s = sum(a.size for a in self._heard) / INPUT_SAMPLE_RATE
        metrics["state"] = "hearing" if self._heard else "listening"
        end_of_speech = self._heard and (
            self._silent_after_speech >= self._b.silence_chunks
            or heard_s >= self._b.max_utterance_s
        )
        if not end_of_speech:
            return DuplexStep(listen=True, kv_cache_length=self._kv, metrics=metrics)
        utterance = np.concatenate(self._heard)
        self._heard, self._preroll, self._silent_after_speech = [], None, 0
        return self._start_reply(utterance, metrics)

    def _start_reply(self, utterance: np.ndarray, metrics: dict[str, Any]) -> DuplexStep:
        t0 = time.perf_counter()
        transcript = self._b.asr.transcribe(utterance)
        metrics["asr_s"] = round(time.perf_counter() - t0, 4)
        metrics["asr_audio_s"] = round(utterance.size / INPUT_SAMPLE_RATE, 3)
        metrics["transcript"] = transcript
        if not transcript:  # noise, not words
            metrics["state"] = "listening"
            return DuplexStep(listen=True, kv_cache_length=self._kv, metrics=metrics)
        self._history.append({"role": "user", "content": transcript})
        self._trim_history()
        reply = _Reply()
        messages = self._messages()
        reply.prompt_tokens = self._kv = self._b.llm.count_tokens(messages)
        reply.thread = threading.Thread(target=self._generate, args=(reply, messages), daemon=True)
        self._reply = reply
        reply.thread.start()
        result = self._speak(metrics)
        result.metrics["first_audio_s"] = round(time.perf_counter() - t0, 4)
        return result

    # ------------------------------------------------------------------ speaking

    def _generate(self, reply: _Reply, messages: ChatMessages) -> None:
        """Background thread: LLM tokens -> sentences -> speech, onto ``reply.out``."""
        try:
            for piece in respond(
                self._b.llm,
                self._b.speaker,
                messages,
                self._b.duplex_max_new_tokens,
                reply.stats,
                reply.cancel.is_set,
            ):
                if piece.audio is not None:
                    reply.out.put((piece.sentence, piece.audio))
        except BaseException as exc:  # noqa: BLE001 - handed to the step thread, re-raised there
            reply.error = exc
        finally:
            reply.out.put(_DONE)

    def _next_segment(self, reply: _Reply) -> bool:
        """Move the next sentence (or the end) from the thread to ``pending``; False at the end."""
        if reply.finished:
            return False
        try:
            item = reply.out.get(timeout=self._b.first_audio_timeout_s)
        except queue.Empty:
            reply.cancel.set()
            raise InferenceError("the pocket reply took too long") from None
        if item is _DONE:
            reply.finished = True
            if reply.error is not None:
                raise InferenceError(f"pocket reply failed: {reply.error}") from reply.error
            return False
        sentence, audio = item
        reply.pending.append([sentence, audio])
        return True

    def _speak(self, metrics: dict[str, Any]) -> DuplexStep:
        reply = self._reply
        assert reply is not None
        try:
            if not reply.pending:
                self._next_segment(reply)
            text, audio = "", np.zeros(0, dtype=np.float32)
            if reply.pending:
                head = reply.pending[0]
                text, head[0] = head[0], ""
                audio, head[1] = head[1][:OUTPUT_SAMPLE_RATE], head[1][OUTPUT_SAMPLE_RATE:]
                if text:
                    reply.spoken.append(text)
                if not head[1].size:
                    reply.pending.popleft()
            # Is this the last piece? Look ahead (waits for the next sentence, or the end).
            last = not reply.pending and not self._next_segment(reply)
        except InferenceError:
            self._stop_reply()
            raise
        metrics.update(reply.stats.as_metrics())
        metrics["state"] = "speaking"
        kv = reply.prompt_tokens + reply.stats.llm.generated_tokens
        if last:
            self._finish_reply(reply)
            kv = self._kv
        if not audio.size and not text:
            if last:
                metrics["state"] = "listening"
            return DuplexStep(listen=True, kv_cache_length=kv, end_of_turn=last, metrics=metrics)
        return DuplexStep(
            listen=False,
            kv_cache_length=kv,
            text=text,
            audio=audio,
            end_of_turn=last,
            metrics=metrics,
        )

    def _finish_reply(self, reply: _Reply) -> None:
        """Keep what was said in the history; the session listens again."""
        if reply.thread is not None:
            reply.thread.join(timeout=30)
        said = " ".join(reply.spoken).strip()
        if said:
            self._history.append({"role": "assistant", "content": said})
        elif self._history and self._history[-1]["role"] == "user":
            self._history.append({"role": "assistant", "content": "..."})
        self._kv = self._b.llm.count_tokens(self._messages())
        self._reply = None

    def _stop_reply(self) -> None:
        """Cancel the reply now (barge-in, force_listen, close)."""
        reply = self._reply
        if reply is None:
            return
        reply.cancel.set()
        reply.pending.clear()
        self._finish_reply(reply)

    # ------------------------------------------------------------------ history

    def _messages(self) -> ChatMessages:
        return [{"role": "system", "content": self._system_prompt}, *self._history]

    def _trim_history(self) -> None:
        """Drop the oldest exchanges until prompt + reply fit in ``max_history_tokens``."""
        budget = self._b.max_history_tokens - self._b.duplex_max_new_tokens
        while len(self._history) > 1 and self._b.llm.count_tokens(self._messages()) > budget:
            del self._history[: 2 if len(self._history) > 2 else 1]
