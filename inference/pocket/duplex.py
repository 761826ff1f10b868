"""Duplex voice sessions for the pocket backend: streaming VAD turns, a reply thread, speech steps.

States: listening -> hearing (the VAD found speech) -> speaking. The end of the utterance is
found inside the chunk that carries it (``turns.TurnDetector``, 32 ms resolution); in that very
step the utterance is transcribed, the reply thread starts (LLM -> clauses -> Piper, the LLM
going on while Piper speaks) and the step returns the first clause's audio. Later steps hand out
<= 1 s of the reply each. Speech while speaking (barge-in), ``force_listen`` or ``interrupt()``
stop the reply at once; the part already spoken stays in the history.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
from inference.pocket.llm import ChatMessages
from inference.pocket.pipeline import TurnStats, respond
from inference.pocket.turns import SpeechEnded, SpeechStarted

if TYPE_CHECKING:
    from inference.pocket.backend import PocketBackend

_DONE = object()  # end of a reply on the reply queue
_TAIL = OUTPUT_SAMPLE_RATE // 10  # audio the first step may keep back (see ``_speak``)


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

    def __init__(self, backend: PocketBackend) -> None:
        self._b = backend
        self._system_prompt = backend.system_prompt
        self._history: ChatMessages = []  # the conversation: the one place it is kept
        self._kv = 0
        self._turns = backend.turn_detector()
        self._overheard = False  # speech that began while speaking, with barge-in off
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
        self._turns = self._b.turn_detector()
        self._overheard = False
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
        forced = chunk.force_listen or self._interrupt.is_set()
        self._interrupt.clear()
        if self._reply is not None and forced:
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
            elif self._overheard:
                self._overheard = False  # spoken over the reply: not a question to answer
            else:
                ended.append(event)
        if ended and self._reply is None:
            result = self._start_reply(ended, metrics)
        elif self._reply is not None:
            result = self._speak(metrics)
        else:
            metrics["state"] = "hearing" if self._turns.in_speech else "listening"
            result = DuplexStep(listen=True, kv_cache_length=self._kv, metrics=metrics)
        result.metrics["step_s"] = round(time.perf_counter() - started, 4)
        return result

    # ------------------------------------------------------------------ listening

    def _start_reply(self, ended: list[SpeechEnded], metrics: dict[str, Any]) -> DuplexStep:
        """Transcribe the utterance(s) this chunk completed and start the reply, at once."""
        t0 = time.perf_counter()
        utterance = np.concatenate([e.audio for e in ended])
        transcript = self._b.asr.transcribe(utterance)
        rate = INPUT_SAMPLE_RATE
        metrics["asr_s"] = round(time.perf_counter() - t0, 4)
        metrics["asr_audio_s"] = round(utterance.size / rate, 3)
        metrics["asr_window_s"] = self._b.asr.last_window_s
        metrics["transcript"] = transcript
        # where, in the signal, the speech ended and the end was decided: seconds before the
        # last sample of this chunk (what a client can relate to its own clock)
        metrics["speech_end_before_chunk_end_s"] = round(
            (self._turns.position - ended[-1].end) / rate, 3
        )
        metrics["end_decided_before_chunk_end_s"] = round(
            (self._turns.position - ended[-1].decided_at) / rate, 3
        )
        metrics["utterance_forced_end"] = ended[-1].forced
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
        result = self._speak(metrics, first=True)
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
                first_clause_priority=self._b.first_clause_priority,
            ):
                if piece.audio is not None:
                    reply.out.put((piece.sentence, piece.audio))
        except BaseException as exc:  # noqa: BLE001 - handed to the step thread
            reply.error = exc
        finally:
            reply.out.put(_DONE)

    def _next_segment(self, reply: _Reply, wait: bool = True) -> bool | None:
        """Move the next sentence (or the end) from the thread into ``pending``.

        True: a sentence came; False: the reply is over; None: nothing yet (only if not ``wait``).
        """
        if reply.finished:
            return False
        try:
            if wait:
                item = reply.out.get(timeout=self._b.first_audio_timeout_s)
            else:
                item = reply.out.get_nowait()
        except queue.Empty:
            if not wait:
                return None
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

    def _speak(self, metrics: dict[str, Any], first: bool = False) -> DuplexStep:
        """Hand out the next <= 1 s of the reply (waiting for it if it is not spoken yet).

        Whether a piece is the reply's last is known by looking ahead. Later steps wait for the
        next sentence or the end; the first step never does (it would delay the first audio by a
        whole sentence): when it cannot tell, it keeps the piece's last ``_TAIL`` samples back,
        so the end of the turn always rides on audio in a later step.
        """
        reply = self._reply
        assert reply is not None
        try:
            if not reply.pending:
                self._next_segment(reply)
            text, audio = "", np.zeros(0, dtype=np.float32)
            last = False
            if reply.pending:
                head = reply.pending[0]
                take = OUTPUT_SAMPLE_RATE
                if first and len(reply.pending) == 1 and head[1].size <= take:
                    ahead = self._next_segment(reply, wait=False)
                    if ahead is None:
                        take = max(0, head[1].size - _TAIL)
                    last = ahead is False
                text, head[0] = head[0], ""
                audio, head[1] = head[1][:take], head[1][take:]
                if text:
                    reply.spoken.append(text)
                if not head[1].size:
                    reply.pending.popleft()
            if not first:
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
