"""Duplex voice sessions for the pocket backend: streaming VAD turns, a reply thread, speech steps.

States: listening -> hearing (the VAD found speech) -> speaking. The end of the utterance is
found inside the chunk that carries it (``turns.TurnDetector``, 32 ms resolution); in that very
step the reply is handed out as soon as its first clause is spoken. Work on it starts earlier
when it can: at a pause (``speculate_after_s`` of silence) the utterance so far is transcribed
and a reply starts on a background thread (LLM -> clauses -> Piper, the LLM going on while Piper
speaks); if the user goes on, that reply is dropped unseen; if the pause becomes the end of the
turn, it is the answer, and often already spoken. Later steps hand out <= 1 s of the reply each.
Speech while speaking (barge-in), ``force_listen`` or ``interrupt()`` stop the reply at once;
the part already spoken stays in the history.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.base import (
    INPUT_SAMPLE_RATE,
    DuplexConfig,
    DuplexInput,
    DuplexSession,
    DuplexStep,
    InferenceError,
)
from inference.pocket.llm import ChatMessages
from inference.pocket.models import PocketModels
from inference.pocket.reply import Reply
from inference.pocket.turns import SpeechEnded, SpeechPaused, SpeechResumed, SpeechStarted


@dataclass(slots=True)
class _Prepared:
    """An answer started at a pause, before it is known whether the user has finished."""

    start: int  # stream position where the utterance starts
    history: ChatMessages  # the conversation with the user's words, trimmed
    transcript: str
    asr: dict[str, Any]  # asr_s, asr_audio_s, asr_window_s
    began: float  # perf_counter when the ASR started
    reply: Reply | None  # None: nothing to answer (no words)


class PocketDuplexSession(DuplexSession):
    """One voice conversation with history, over the backend's loaded models."""

    def __init__(self, backend: PocketModels) -> None:
        self._b = backend
        self._system_prompt = backend.system_prompt
        self._history: ChatMessages = []  # the conversation: the one place it is kept
        self._kv = 0
        self._turns = backend.turn_detector()
        self._overheard = False  # speech that began while speaking, with barge-in off
        self._reply: Reply | None = None
        self._prepared: _Prepared | None = None
        self._interrupt = threading.Event()
        self._frames_total = 0
        self._closed = False

    # ------------------------------------------------------------------ interface

    def prepare(self, config: DuplexConfig) -> int:
        """Start a fresh conversation; ``config.system_prompt`` replaces the default one."""
        self._stop_reply()
        self._drop_prepared()
        self._system_prompt = config.system_prompt.strip() or self._b.system_prompt
        # a failover: the conversation so far, trimmed to the prompt budget like any other
        self._history = self._trimmed([{"role": t.role, "content": t.text} for t in config.history])
        self._turns = self._b.turn_detector()
        self._overheard = False
        self._interrupt.clear()
        self._kv = self._b.llm.count_tokens(self._messages(self._history))
        return self._kv

    def reprime(self, config: DuplexConfig) -> int:
        """A rollover: ``prepare`` starts the conversation afresh from ``config.history`` (the
        reply in progress stops, its spoken part kept by the worker)."""
        return self.prepare(config)

    def interrupt(self) -> None:
        """Stop speaking at once; the next step listens."""
        self._interrupt.set()
        if self._reply is not None:
            self._reply.cancel.set()

    def close(self) -> None:
        """Stop any reply and drop all conversation state."""
        self._stop_reply()
        self._drop_prepared()
        self._history = []
        self._kv = 0
        self._closed = True

    def step(self, chunk: DuplexInput) -> DuplexStep:
        """Consume one input chunk (any length); listen, or hand out the next <= 1 s of reply."""
        if self._closed:
            raise InferenceError("the duplex session is closed")
        started = time.perf_counter()
        audio = np.asarray(chunk.audio, dtype=np.float32).reshape(-1)
        self._frames_total += len(chunk.frames)
        events = self._turns.push(audio)
        metrics: dict[str, Any] = {
            "vad_s": round(time.perf_counter() - started, 4),
            "vision_frames": len(chunk.frames),
            "vision_frames_total": self._frames_total,
        }
        if chunk.force_listen or self._interrupt.is_set():
            self._interrupt.clear()
            self._drop_prepared()
            if self._reply is not None:
                metrics["interrupted"] = "force_listen"
                self._stop_reply()
        ended: list[SpeechEnded] = []
        for event in events:
            if isinstance(event, SpeechStarted):
                if self._reply is None:
                    self._overheard = False
                elif self._b.barge_in:
                    metrics["interrupted"] = "barge_in"
                    self._stop_reply()
                    self._overheard = False
                else:
                    self._overheard = True
            elif isinstance(event, SpeechResumed):
                self._drop_prepared()
            elif isinstance(event, SpeechPaused):
                if not self._overheard and self._reply is None:
                    self._prepare_answer(event)
            elif self._overheard:
                self._overheard = False  # spoken over the reply: not a question to answer
            else:
                ended.append(event)
        if ended and self._reply is None:
            result = self._answer(ended, metrics, started)
        elif self._reply is not None:
            result = self._speak(metrics)
        else:
            metrics["state"] = "hearing" if self._turns.in_speech else "listening"
            result = DuplexStep(listen=True, kv_cache_length=self._kv, metrics=metrics)
        result.metrics["step_s"] = round(time.perf_counter() - started, 4)
        return result

    # ------------------------------------------------------------------ listening

    def _prepare_answer(self, event: SpeechEnded | SpeechPaused) -> _Prepared:
        """Transcribe the utterance and start its reply (not handed out until it is wanted)."""
        self._drop_prepared()
        began = time.perf_counter()
        transcript = self._b.asr.transcribe(event.audio)
        asr = {
            "asr_s": round(time.perf_counter() - began, 4),
            "asr_audio_s": round(event.audio.size / INPUT_SAMPLE_RATE, 3),
            "asr_window_s": self._b.asr.last_window_s,
        }
        history, reply = self._history, None
        if transcript:
            history = self._trimmed([*self._history, {"role": "user", "content": transcript}])
            messages = self._messages(history)
            reply = Reply(self._b, messages, self._b.llm.count_tokens(messages))
        self._prepared = _Prepared(event.start, history, transcript, asr, began, reply)
        return self._prepared

    def _answer(
        self, ended: list[SpeechEnded], metrics: dict[str, Any], started: float
    ) -> DuplexStep:
        """The user's turn ended in this chunk: hand out the answer's first clause at once."""
        last, prepared = ended[-1], self._prepared
        usable = prepared is not None and len(ended) == 1 and prepared.start == last.start
        if prepared is None or not usable:
            if len(ended) > 1:  # several short utterances in one chunk: one question
                audio = np.concatenate([e.audio for e in ended])
                last = SpeechEnded(audio, ended[0].start, last.end, last.decided_at, last.forced)
            prepared = self._prepare_answer(last)
        self._prepared = None
        rate = INPUT_SAMPLE_RATE
        metrics.update(prepared.asr)
        metrics["transcript"] = prepared.transcript
        # started at a pause in an earlier step: part of the work was done before this chunk
        metrics["speculative"] = prepared.began < started
        metrics["prepared_before_step_s"] = round(max(0.0, started - prepared.began), 4)
        # where, in the signal, the speech ended and the end was decided: seconds before the
        # last sample of this chunk (what a client can relate to its own clock)
        metrics["speech_end_before_chunk_end_s"] = round(
            (self._turns.position - last.end) / rate, 3
        )
        metrics["end_decided_before_chunk_end_s"] = round(
            (self._turns.position - last.decided_at) / rate, 3
        )
        metrics["utterance_forced_end"] = last.forced
        if prepared.reply is None:  # noise, not words
            metrics["state"] = "listening"
            return DuplexStep(listen=True, kv_cache_length=self._kv, metrics=metrics)
        self._history = prepared.history
        self._reply = prepared.reply
        self._kv = prepared.reply.prompt_tokens
        waited = time.perf_counter()
        result = self._speak(metrics, first=True)
        result.heard = prepared.transcript
        result.metrics["first_audio_wait_s"] = round(time.perf_counter() - waited, 4)
        if prepared.reply.first_audio_at is not None:
            result.metrics["first_audio_s"] = round(
                prepared.reply.first_audio_at - prepared.began, 4
            )
        return result

    def _drop_prepared(self) -> None:
        """Forget an answer started at a pause (the user went on); never blocks."""
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared.reply is not None:
            prepared.reply.stop(wait=False)

    # ------------------------------------------------------------------ speaking

    def _speak(self, metrics: dict[str, Any], first: bool = False) -> DuplexStep:
        """Hand out the next <= 1 s of the reply (``Reply.take``)."""
        reply = self._reply
        assert reply is not None
        try:
            text, audio, last = reply.take(first)
        except InferenceError:
            self._stop_reply()
            raise
        metrics.update(reply.stats.as_metrics())
        metrics["state"] = "speaking"
        kv = reply.prompt_tokens + reply.generated_tokens
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

    def _finish_reply(self, reply: Reply) -> None:
        """Keep what was said in the history; the session listens again."""
        reply.stop(wait=True)
        said = "".join(reply.spoken).strip()  # the clauses keep their own spaces
        if said:
            self._history.append({"role": "assistant", "content": said})
        elif self._history and self._history[-1]["role"] == "user":
            self._history.append({"role": "assistant", "content": "..."})
        self._kv = self._b.llm.count_tokens(self._messages(self._history))
        self._reply = None

    def _stop_reply(self) -> None:
        """Cancel the reply now (barge-in, force_listen, close)."""
        if self._reply is not None:
            self._finish_reply(self._reply)

    # ------------------------------------------------------------------ history

    def _messages(self, history: ChatMessages) -> ChatMessages:
        return [{"role": "system", "content": self._system_prompt}, *history]

    def _trimmed(self, history: ChatMessages) -> ChatMessages:
        """Drop the oldest exchanges until prompt + reply fit in ``max_history_tokens``."""
        budget = self._b.max_history_tokens - self._b.duplex_max_new_tokens
        history = list(history)
        while len(history) > 1 and self._b.llm.count_tokens(self._messages(history)) > budget:
            del history[: 2 if len(history) > 2 else 1]
        return history
