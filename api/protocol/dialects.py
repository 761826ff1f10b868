"""Worker events -> client frames, for every endpoint and dialect, in one place.

- ``DuplexMapper``: ``/v1/realtime`` video/audio, in the ``current`` dialect (spec/01-03:
  ``response.output.delta {kind}``) or the ``older`` one (spec/04: ``response.listen``,
  ``response.output_audio.delta``);
- ``ChatMapper``: ``/v1/realtime`` chat mode;
- ``LegacyChatMapper``: ``/ws/chat`` (spec/05).

Every mapper turns a ``Gap`` (output the replay log no longer holds) into an error the client
sees; nothing is skipped silently. Events a relay handles itself (``Started``, ``Closed``,
``TurnEnd``) map to no frame here unless the dialect has one.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from api.protocol.errors import Frame, error_frame
from api.protocol.events import OLDER_CLIENT_EVENTS, DeltaKind, LegacyChatEvent, ServerEvent
from streaming.events import (
    AudioDelta,
    Closed,
    CloseReason,
    Created,
    Done,
    Error,
    ErrorCode,
    Event,
    Expiring,
    Gap,
    Listen,
    Prefill,
    Rollover,
    Speak,
    TextDelta,
)

# The names of the deltas, as plain strings: on the relay's hot path an enum member's lookup and
# serialisation cost more than building the rest of the frame (python -m bench.event_codec).
_OUTPUT_DELTA: str = ServerEvent.RESPONSE_OUTPUT_DELTA.value
_LISTEN: str = ServerEvent.RESPONSE_LISTEN.value
_OUTPUT_AUDIO_DELTA: str = ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA.value
_KIND_LISTEN: str = DeltaKind.LISTEN.value
_KIND_TEXT: str = DeltaKind.TEXT.value
_KIND_AUDIO: str = DeltaKind.AUDIO.value
_CHUNK: str = LegacyChatEvent.CHUNK.value


class Dialect(StrEnum):
    """The generation of event names a client speaks (its first event decides)."""

    CURRENT = "current"
    OLDER = "older"


def dialect_of(event_type: str) -> Dialect:
    """The dialect a client's first event implies."""
    return Dialect.OLDER if event_type in OLDER_CLIENT_EVENTS else Dialect.CURRENT


def older_close_reason(reason: str, client_reason: str) -> str:
    """``session.closed.reason`` in spec/04's words: ``stopped`` confirms the client's own
    ``session.close`` (``client_reason``), ``error`` is any unrecoverable failure."""
    if reason == client_reason:
        return CloseReason.STOPPED
    if reason == CloseReason.BACKEND_ERROR:
        return CloseReason.ERROR
    return reason


def gap_message(gap: Gap) -> str:
    """What a client is told about lost output."""
    return f"output events {gap.first}..{gap.last} were lost and cannot be replayed"


def gap_frame(gap: Gap) -> Frame:
    """Output the replay log no longer holds is reported, never skipped silently."""
    return error_frame(ErrorCode.OUTPUT_GAP, gap_message(gap))


def worker_error_frame(ev: Error) -> Frame:
    """A worker's error, as ``/v1/realtime`` sends it."""
    return error_frame(ev.code, ev.message, ev.field)


class DuplexMapper:
    """Maps one duplex session's events for its client."""

    def __init__(self, dialect: Dialect, session_id: str, recording_id: str | None = None) -> None:
        self.dialect = dialect
        self.session_id = session_id
        self.recording_id = recording_id  # named in session.created when the session is recorded
        self.kv_cache_length = 0

    def frames(self, ev: Event) -> list[Frame]:
        """Frames for one event (``Started`` and ``Closed`` are the relay's)."""
        match ev:
            case Created():
                return [self._created(ev)]
            case Listen():
                return [self._listen(ev)]
            case Speak():
                return self._speak(ev)
            case Rollover():
                return self._rollover(ev)
            case Expiring():  # sent only to a client that opted in (its init's extensions)
                return [
                    {
                        "type": ServerEvent.SESSION_EXPIRING,
                        "session_id": self.session_id,
                        "reason": ev.reason.value,
                        "time_left_ms": ev.time_left_ms,
                    }
                ]
            case Error():
                return [worker_error_frame(ev)]
            case Gap():
                return [gap_frame(ev)]
            case _:
                return []

    def _rollover(self, ev: Rollover) -> list[Frame]:
        """The extension event of a rollover (current dialect; the older one has no extension
        events and sees only ``kv_cache_length`` drop in its next delta)."""
        self.kv_cache_length = ev.kv_cache_length
        if self.dialect is Dialect.OLDER:
            return []
        return [
            {
                "type": ServerEvent.SESSION_ROLLOVER,
                "session_id": self.session_id,
                "kv_cache_length": ev.kv_cache_length,
                "metrics": ev.metrics,
            }
        ]

    def _created(self, ev: Created) -> Frame:
        self.kv_cache_length = ev.prompt_length
        frame: Frame = {"type": ServerEvent.SESSION_CREATED, "session_id": self.session_id}
        if self.dialect is Dialect.CURRENT:
            frame["mode"] = "full_duplex"
            frame["metrics"] = ev.metrics
        frame["prompt_length"] = ev.prompt_length
        if self.recording_id:
            frame["recording_id"] = self.recording_id
        return frame

    def _listen(self, ev: Listen) -> Frame:
        self.kv_cache_length = ev.kv_cache_length or self.kv_cache_length
        if self.dialect is Dialect.OLDER:
            return {"type": _LISTEN, "kv_cache_length": self.kv_cache_length}
        return {
            "type": _OUTPUT_DELTA,
            "kind": _KIND_LISTEN,
            "session_id": self.session_id,
            "input_id": ev.input_id,
            "text": "",
            "metrics": ev.metrics,
        }

    def _speak(self, ev: Speak) -> list[Frame]:
        if ev.kv_cache_length is not None:
            self.kv_cache_length = ev.kv_cache_length
        if self.dialect is Dialect.OLDER:
            return [
                {
                    "type": _OUTPUT_AUDIO_DELTA,
                    "text": ev.text,
                    "audio": ev.audio,
                    "end_of_turn": ev.end_of_turn,
                    "kv_cache_length": self.kv_cache_length,
                }
            ]
        base: Frame = {
            "type": _OUTPUT_DELTA,
            "session_id": self.session_id,
            "response_id": ev.response_id,
            "input_id": ev.input_id,
        }
        metrics: dict[str, Any] = {**ev.metrics, "end_of_turn": ev.end_of_turn}
        if ev.interrupted:  # the closing piece of a response cut short, not one its model ended
            metrics["interrupted"] = True
        frames = []
        if ev.text:
            frames.append({**base, "kind": _KIND_TEXT, "text": ev.text, "metrics": metrics})
        if ev.audio:
            frames.append({**base, "kind": _KIND_AUDIO, "audio": ev.audio, "metrics": metrics})
        return frames


class ChatMapper:
    """Maps one ``/v1/realtime`` chat turn's events (``Closed`` is the relay's).

    Every delta names the ``input.append`` it answers (``input_id``), as duplex deltas do.
    """

    def __init__(self, session_id: str, response_id: str, input_id: str) -> None:
        self.base: Frame = {"session_id": session_id, "response_id": response_id}
        self.input_id = input_id

    def _delta(self, kind: str, key: str, value: str) -> Frame:
        return {
            "type": _OUTPUT_DELTA,
            "kind": kind,
            **self.base,
            "input_id": self.input_id,
            key: value,
            "metrics": {},
        }

    def frames(self, ev: Event) -> list[Frame]:
        """Frames for one event of the turn."""
        match ev:
            case TextDelta():
                return [self._delta(_KIND_TEXT, "text", ev.text)]
            case AudioDelta():
                return [self._delta(_KIND_AUDIO, "audio", ev.audio)]
            case Done():
                frames = []
                if ev.last_audio:  # the end of a streamed turn's speech
                    frames.append(self._delta(_KIND_AUDIO, "audio", ev.last_audio))
                done: Frame = {
                    "type": ServerEvent.RESPONSE_DONE,
                    **self.base,
                    "text": ev.text,
                    "reason": "turn_end",
                    "metrics": ev.metrics,
                }
                if ev.audio:
                    done["audio"] = ev.audio
                frames.append(done)
                return frames
            case Error():
                return [worker_error_frame(ev)]
            case Gap():
                return [gap_frame(ev)]
            case _:
                return []


def legacy_error(message: str) -> Frame:
    """The ``/ws/chat`` error frame (spec/05: a string; the connection closes after it)."""
    return {"type": LegacyChatEvent.ERROR, "error": message}


def legacy_chunk(text_delta: str, audio_data: str | None) -> Frame:
    """A ``/ws/chat`` ``chunk``: a piece of the answer's text or of its speech."""
    return {"type": _CHUNK, "text_delta": text_delta, "audio_data": audio_data}


class LegacyChatMapper:
    """Maps the one turn of a ``/ws/chat`` connection; a ``done`` or ``error`` frame ends it."""

    ENDING = frozenset({LegacyChatEvent.DONE, LegacyChatEvent.ERROR})

    def __init__(self, recording_id: str) -> None:
        self.recording_id = recording_id
        self.text = ""

    def frames(self, ev: Event) -> list[Frame]:
        """Frames for one event of the turn."""
        match ev:
            case Prefill():
                return [{"type": LegacyChatEvent.PREFILL_DONE, "input_tokens": ev.input_tokens}]
            case TextDelta():
                self.text += ev.text
                return [legacy_chunk(ev.text, None)]
            case AudioDelta():
                return [legacy_chunk("", ev.audio)]
            case Done():
                # non-streaming: the whole speech in done. Streaming: every piece of speech in
                # chunks, the final segment too, and done's audio_data null (nothing left over):
                # what the official gateway does; players such as its turn-based page play only
                # the chunks, and a spec/05 client that appends done's segment appends nothing.
                frames: list[Frame] = []
                if ev.last_audio:
                    frames.append(legacy_chunk("", ev.last_audio))
                done: Frame = {
                    "type": LegacyChatEvent.DONE,
                    "text": ev.text,
                    "generated_tokens": ev.generated_tokens,
                    "input_tokens": ev.input_tokens,
                    "audio_data": ev.audio or None,
                    "recording_session_id": self.recording_id,
                }
                return [*frames, done]
            case Error():
                return [legacy_error(ev.message or ev.code.value)]
            case Gap():
                return [legacy_error(f"{ErrorCode.OUTPUT_GAP.value}: {gap_message(ev)}")]
            case Closed():  # the worker stopped the turn early (drain, deadline)
                return [legacy_error("generation ended without a result")]
            case _:
                return []
