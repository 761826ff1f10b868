"""The worker -> gateway contract: every output event, error code and close reason, defined once.

A worker emits these events through its session's output channel (``streaming/output.py``); the
gateway decodes them back into the same classes and maps them to the client's dialect
(``api/protocol/dialects.py``). Both sides import this module, so an event, a field, an error code
or a close reason is spelled in exactly one place and the type checker follows it everywhere.

The events are plain slotted dataclasses: ``orjson`` encodes them natively (about as fast as
plain dicts), and one pydantic ``TypeAdapter`` over the tagged union decodes and checks them; for
an audio delta that is faster than ``orjson.loads`` into a dict (docs/BENCHMARKS.md, "Typed
events on the relay"). Every event carries its per-session ``seq`` (set by the publisher)
and ``emitted_at``, the worker's wall-clock time of ``emit``, so relay latency can be measured
from the events themselves.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal, cast

import pybase64
from pydantic import Field, TypeAdapter, ValidationError

from streaming.codec import dumps


class ErrorCode(StrEnum):
    """Every ``error.code`` a client can see (docs/PROTOCOL.md, "Error codes")."""

    # client errors: the session goes on
    NOT_READY = "not_ready"
    UNKNOWN_EVENT = "unknown_event"
    MISSING_FIELD = "missing_field"
    INVALID_PAYLOAD = "invalid_payload"
    UNAUTHORIZED = "unauthorized"
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    SESSION_NOT_FOUND = "session_not_found"  # session.resume: no such session, or a wrong token
    RESUME_EXPIRED = "resume_expired"  # session.resume after the grace period or the session end
    QUOTA_EXCEEDED = "quota_exceeded"  # the key's concurrent-sessions or daily-minutes quota
    # server errors
    SERVICE_UNAVAILABLE = "service_unavailable"
    QUEUE_FULL = "queue_full"
    WORKER_BUSY = "worker_busy"
    WORKER_CONNECT_FAILED = "worker_connect_failed"
    INFERENCE_ERROR = "inference_error"
    BACKEND_ERROR = "backend_error"
    OUTPUT_GAP = "output_gap"
    TURN_QUEUE_FULL = "turn_queue_full"  # chat: too many turns waiting on this connection

    @property
    def is_client_error(self) -> bool:
        """Whether the client caused it (``error.type`` is then ``client_error``)."""
        return self in _CLIENT_ERRORS


_CLIENT_ERRORS = frozenset(
    {
        ErrorCode.NOT_READY,
        ErrorCode.UNKNOWN_EVENT,
        ErrorCode.MISSING_FIELD,
        ErrorCode.INVALID_PAYLOAD,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.ORIGIN_NOT_ALLOWED,
        ErrorCode.TOO_MANY_CONNECTIONS,
        ErrorCode.TURN_QUEUE_FULL,
        ErrorCode.SESSION_NOT_FOUND,
        ErrorCode.RESUME_EXPIRED,
        ErrorCode.QUOTA_EXCEEDED,
    }
)


class CloseReason(StrEnum):
    """Why a session ended (``session.closed.reason``); a client's own reason is echoed as is."""

    USER_STOP = "user_stop"  # the client's session.close without a reason
    STOPPED = "stopped"  # the older dialect's confirmation of a client's session.close
    TIMEOUT = "timeout"
    CONTEXT_FULL = "context_full"
    SERVER_SHUTDOWN = "server_shutdown"
    BACKEND_ERROR = "backend_error"
    ERROR = "error"
    CLIENT_CLOSED = "client_closed"  # internal: the client or its gateway is gone
    CLIENT_IDLE = "client_idle"  # a duplex client sent nothing for client_idle_timeout_s
    PING_TIMEOUT = "ping_timeout"  # the client stopped answering WebSocket pings
    OUTPUT_BACKPRESSURE = "output_backpressure"  # the client did not read its output
    REPLACED = "replaced"  # another connection resumed this session (docs/PROTOCOL.md)


# --------------------------------------------------------------------------- the events


@dataclass(slots=True, kw_only=True)
class _Envelope:
    """What every event carries besides its payload (set by ``OutputPublisher.emit``)."""

    seq: int = 0  # per session, 1, 2, 3 ...
    emitted_at: float = 0.0  # worker wall clock at emit (unix seconds)


@dataclass(slots=True, kw_only=True)
class Started(_Envelope):
    """The worker claimed the session or turn and holds its slot."""

    type: Literal["started"] = "started"
    worker_id: str
    backend: str | None = None


@dataclass(slots=True, kw_only=True)
class Created(_Envelope):
    """Duplex: the backend prepared the session (the answer to an init control)."""

    type: Literal["created"] = "created"
    prompt_length: int
    metrics: dict[str, Any] = field(default_factory=dict)
    recovered: bool = False  # a failover: a new worker prepared it with the conversation so far


@dataclass(slots=True, kw_only=True)
class Recovering(_Envelope):
    """Duplex: the session's worker is gone (or its slot was given back while the client was
    away) and a new worker is being found for it. Written by the gateway into the session's
    own sequence (``streaming/takeover.py``), so a resumed client replays it like any event."""

    type: Literal["recovering"] = "recovering"
    reason: str


@dataclass(slots=True, kw_only=True)
class Listen(_Envelope):
    """Duplex: one step in which the model listened."""

    type: Literal["listen"] = "listen"
    input_id: str
    kv_cache_length: int
    metrics: dict[str, Any] = field(default_factory=dict)
    worker_s: float = 0.0  # the backend's compute time for the step (usage)


@dataclass(slots=True, kw_only=True)
class Speak(_Envelope):
    """Duplex: one piece of a spoken response (text rides on the first piece of a step)."""

    type: Literal["speak"] = "speak"
    response_id: str
    # the input whose step produced the piece; the closing piece of an interrupted response
    # names the response's last speaking step (whose audio it flushes)
    input_id: str
    text: str = ""
    audio: str = ""  # base64 float32 PCM, 24 kHz; "" for none
    end_of_turn: bool = False
    interrupted: bool = False
    kv_cache_length: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # usage, on the first piece of a step only: its compute time and its text's tokens
    worker_s: float = 0.0
    text_tokens: int = 0


@dataclass(slots=True, kw_only=True)
class Rollover(_Envelope):
    """Duplex: the KV cache passed its budget and the session goes on in a fresh model session,
    primed with the conversation so far (between two steps; no input is lost)."""

    type: Literal["rollover"] = "rollover"
    kv_cache_length: int  # the new session's prompt: where the cache starts again
    metrics: dict[str, Any] = field(default_factory=dict)


class ExpiringReason(StrEnum):
    """What is about to end a session (``Expiring.reason``)."""

    DURATION = "duration"  # its duration limit
    CONTEXT = "context"  # its context window, with rollover off


@dataclass(slots=True, kw_only=True)
class Expiring(_Envelope):
    """Duplex, for a client that opted in: the session ends in about ``time_left_ms``."""

    type: Literal["expiring"] = "expiring"
    reason: ExpiringReason
    time_left_ms: int


@dataclass(slots=True, kw_only=True)
class Prefill(_Envelope):
    """Chat: the backend read the whole request."""

    type: Literal["prefill"] = "prefill"
    input_tokens: int
    prefill_s: float = 0.0


@dataclass(slots=True, kw_only=True)
class TextDelta(_Envelope):
    """Chat (streaming): new text."""

    type: Literal["text"] = "text"
    text: str


@dataclass(slots=True, kw_only=True)
class AudioDelta(_Envelope):
    """Chat (streaming): one protocol-sized piece of speech."""

    type: Literal["audio"] = "audio"
    audio: str


@dataclass(slots=True, kw_only=True)
class Done(_Envelope):
    """Chat: the turn's result.

    ``audio`` is the whole speech of a non-streaming turn; ``last_audio`` the final (short)
    piece of a streaming turn's speech, which was not sent as an ``AudioDelta``.
    """

    type: Literal["done"] = "done"
    text: str
    input_tokens: int = 0
    generated_tokens: int = 0
    audio: str = ""
    last_audio: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    worker_s: float = 0.0  # the backend's compute time for the turn (usage)


@dataclass(slots=True, kw_only=True)
class Error(_Envelope):
    """Something failed; ``recoverable`` errors leave the session open."""

    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    recoverable: bool = True
    field: str | None = None
    input_id: str | None = None


@dataclass(slots=True, kw_only=True)
class Closed(_Envelope):
    """The worker ended the session (duplex) or stopped a turn early (chat)."""

    type: Literal["closed"] = "closed"
    reason: str  # a CloseReason, or the client's own reason echoed


@dataclass(slots=True, kw_only=True)
class TurnEnd(_Envelope):
    """Chat: the turn task is finished (always its last event)."""

    type: Literal["turn_end"] = "turn_end"


@dataclass(slots=True, kw_only=True)
class Gap(_Envelope):
    """Gateway side only: events ``first..last`` were lost and the replay log no longer has them.

    Never published by a worker; the gateway's ordered reader puts it where the lost events were,
    so every relay reports the loss instead of skipping it.
    """

    type: Literal["gap"] = "gap"
    first: int
    last: int


Event = Annotated[
    Started
    | Created
    | Recovering
    | Listen
    | Speak
    | Rollover
    | Expiring
    | Prefill
    | TextDelta
    | AudioDelta
    | Done
    | Error
    | Closed
    | TurnEnd
    | Gap,
    Field(discriminator="type"),
]
"""Any event of a session's output stream."""

FINAL_EVENTS = (Closed, TurnEnd)
"""Events after which a task emits nothing more (a chat turn's Closed is followed by TurnEnd)."""

_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def tag(cls: type[_Envelope]) -> str:
    """The ``type`` tag an event class is encoded with (for readers of the raw JSON)."""
    return cast(str, cls.__dataclass_fields__["type"].default)


class BadEvent(ValueError):
    """Bytes that are not an event of this contract."""


# the base64 audio fields of each event class that cross Redis as raw bytes (``encode_event``)
_RAW_FIELDS: dict[type[_Envelope], tuple[str, ...]] = {
    Speak: ("audio",),
    AudioDelta: ("audio",),
    Done: ("audio", "last_audio"),
}
_TAIL = b"\n"  # compact JSON never holds a raw newline: what follows it is the raw audio
_LEN = 4  # each raw field: its length (big-endian), then its bytes


def encode_event(event: Event) -> bytes:
    """The bytes of an event as it crosses Redis: its JSON (``type`` tag included), and for an
    event with audio, the audio as raw bytes after it.

    The audio fields hold base64 in the process (the client's wire form); inside Redis they are
    raw PCM, a quarter fewer bytes to write, publish, log and read: the JSON carries them
    empty and, after a newline, each non-empty one follows as ``<4-byte length><bytes>`` in the
    order of ``_RAW_FIELDS`` (an empty one: length 0). A field that is not canonical base64
    (decoded and encoded again it would differ) stays in the JSON, as every field of an event
    without audio does."""
    names = _RAW_FIELDS.get(type(event))
    if not names:
        return dumps(event)
    values = [cast(str, getattr(event, name)) for name in names]
    if not any(values):
        return dumps(event)
    raws: list[bytes] = []
    for value in values:
        raw = _raw(value)
        if raw is None:
            return dumps(event)
        raws.append(raw)
    try:
        for name in names:
            setattr(event, name, "")
        head = dumps(event)
    finally:
        for name, value in zip(names, values, strict=True):
            setattr(event, name, value)
    parts = [head, _TAIL]
    for raw in raws:
        parts += [len(raw).to_bytes(_LEN, "big"), raw]
    return b"".join(parts)


def _raw(value: str) -> bytes | None:
    """The bytes a base64 field holds, when it is canonical base64 (else None)."""
    if not value:
        return b""
    try:
        raw = pybase64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if pybase64.b64encode_as_string(raw) == value else None


def event_head(data: bytes) -> bytes:
    """The JSON part of an encoded event (its audio fields empty when it carries raw audio)."""
    cut = data.find(_TAIL)
    return data if cut < 0 else data[:cut]


def decode_event(data: bytes | str) -> Event:
    """The event ``data`` holds (``encode_event``'s form); BadEvent when it is not one."""
    raw = data.encode() if isinstance(data, str) else data
    cut = raw.find(_TAIL)
    try:
        event = _ADAPTER.validate_json(raw if cut < 0 else raw[:cut])
    except ValidationError as exc:
        raise BadEvent(str(exc)) from None
    if cut >= 0:
        _fill(event, memoryview(raw)[cut + 1 :])
    return event


def _fill(event: Event, tail: memoryview) -> None:
    """Set the audio fields of ``event`` from the raw tail of its encoding."""
    names = _RAW_FIELDS.get(type(event), ())
    if not names:
        raise BadEvent(f"a {event.type} event with a raw tail")
    at = 0
    for name in names:
        if at + _LEN > len(tail):
            raise BadEvent(f"truncated raw audio of a {event.type} event")
        n = int.from_bytes(tail[at : at + _LEN], "big")
        at += _LEN
        if at + n > len(tail):
            raise BadEvent(f"truncated raw audio of a {event.type} event")
        if n:
            setattr(event, name, pybase64.b64encode_as_string(tail[at : at + n]))
        at += n
    if at != len(tail):
        raise BadEvent(f"{len(tail) - at} stray bytes after a {event.type} event")
