"""Every event type of the public client protocol, named once.

A frame's ``type`` is one of these names, on every endpoint:

- ``/v1/realtime``: ``ClientEvent`` (what a client sends, both dialects) and ``ServerEvent``
  (what it is sent, both dialects); ``CURRENT_*`` and ``OLDER_*`` say which names each dialect
  uses (spec/01-03 and spec/04), ``DeltaKind`` is a ``response.output.delta``'s ``kind``;
- ``/ws/chat`` (spec/05): ``LegacyChatEvent``, after the queue events of ``ServerEvent``;
- the official gateway's older ``/ws/duplex``: ``OfficialClientEvent`` and ``OfficialEvent``
  (its frames: ``api/official/duplex_frames.py``);
- a chat message's content items: ``ContentType``.

``EXTENSIONS`` lists the names omniserve adds to the spec's (docs/PROTOCOL.md says what each
does); ``tests/unit/api/protocol/test_events.py`` checks both lists against /work/shared/spec.
Error codes and close reasons are ``streaming.events.ErrorCode`` and ``CloseReason`` (workers
send them too; ``api/protocol/errors.py`` re-exports them for the api).

They are ``StrEnum``s: a member is its string (``ServerEvent.ERROR == "error"``, and orjson
writes it as that string), so frames stay plain dicts, cheap on the relay's hot path.
"""

from __future__ import annotations

from enum import StrEnum


class ClientEvent(StrEnum):
    """What a ``/v1/realtime`` client sends (either dialect, on any connection)."""

    SESSION_INIT = "session.init"
    INPUT_APPEND = "input.append"
    SESSION_CLOSE = "session.close"
    # the older dialect (spec/04)
    SESSION_UPDATE = "session.update"
    INPUT_AUDIO_BUFFER_APPEND = "input_audio_buffer.append"
    # extensions
    SESSION_RESUME = "session.resume"
    CLIENT_DIAGNOSTIC = "client_diagnostic"  # also on the official /ws/duplex


class ServerEvent(StrEnum):
    """What a ``/v1/realtime`` client is sent (the queue events also on ``/ws/chat``)."""

    SESSION_QUEUED = "session.queued"
    SESSION_QUEUE_UPDATE = "session.queue_update"
    SESSION_QUEUE_DONE = "session.queue_done"
    SESSION_CREATED = "session.created"
    RESPONSE_OUTPUT_DELTA = "response.output.delta"
    RESPONSE_DONE = "response.done"
    SESSION_CLOSED = "session.closed"
    ERROR = "error"
    # the older dialect's duplex output (spec/04)
    RESPONSE_LISTEN = "response.listen"
    RESPONSE_OUTPUT_AUDIO_DELTA = "response.output_audio.delta"
    # extensions: a chat turn's own wait, resume, failover, long calls
    RESPONSE_QUEUED = "response.queued"
    RESPONSE_QUEUE_UPDATE = "response.queue_update"
    RESPONSE_QUEUE_DONE = "response.queue_done"
    SESSION_RESUMED = "session.resumed"
    SESSION_RESYNC_REQUIRED = "session.resync_required"
    SESSION_RECOVERING = "session.recovering"
    SESSION_RECOVERED = "session.recovered"
    SESSION_ROLLOVER = "session.rollover"
    SESSION_EXPIRING = "session.expiring"


class DeltaKind(StrEnum):
    """The ``kind`` of a ``response.output.delta``."""

    LISTEN = "listen"
    TEXT = "text"
    AUDIO = "audio"


class LegacyChatEvent(StrEnum):
    """What a ``/ws/chat`` client is sent after its queue events (spec/05)."""

    PREFILL_DONE = "prefill_done"
    CHUNK = "chunk"
    DONE = "done"
    ERROR = "error"


class OfficialClientEvent(StrEnum):
    """What a client of the official gateway's ``/ws/duplex`` sends (and ``client_diagnostic``)."""

    PREPARE = "prepare"
    AUDIO_CHUNK = "audio_chunk"
    PAUSE = "pause"
    RESUME = "resume"
    INTERRUPT = "interrupt"
    STOP = "stop"


class OfficialEvent(StrEnum):
    """What a client of the official gateway's ``/ws/duplex`` is sent."""

    QUEUED = "queued"
    QUEUE_UPDATE = "queue_update"
    QUEUE_DONE = "queue_done"
    PREPARED = "prepared"
    RESULT = "result"
    PAUSED = "paused"
    RESUMED = "resumed"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"
    TIMEOUT = "timeout"
    ERROR = "error"


class ContentType(StrEnum):
    """The ``type`` of an item of a chat message's content list."""

    TEXT = "text"
    IMAGE = "image"
    AUDIO = "audio"
    VIDEO = "video"


OLDER_CLIENT_EVENTS = frozenset({ClientEvent.SESSION_UPDATE, ClientEvent.INPUT_AUDIO_BUFFER_APPEND})
"""The events that make a connection's dialect ``older`` when they come first."""
CURRENT_CLIENT_EVENTS = frozenset(ClientEvent) - OLDER_CLIENT_EVENTS
INIT_EVENTS = frozenset({ClientEvent.SESSION_INIT, ClientEvent.SESSION_UPDATE})

OLDER_ONLY = frozenset({ServerEvent.RESPONSE_LISTEN, ServerEvent.RESPONSE_OUTPUT_AUDIO_DELTA})
CURRENT_ONLY = frozenset(
    {
        ServerEvent.RESPONSE_OUTPUT_DELTA,  # (chat mode sends it in both dialects)
        ServerEvent.SESSION_ROLLOVER,
        ServerEvent.SESSION_RESUMED,
        ServerEvent.SESSION_RESYNC_REQUIRED,
    }
)
CURRENT_SERVER_EVENTS = frozenset(ServerEvent) - OLDER_ONLY
"""What a current-dialect duplex session may be sent."""
OLDER_SERVER_EVENTS = frozenset(ServerEvent) - CURRENT_ONLY
"""What an older-dialect duplex session may be sent."""

QUEUE_EVENTS = frozenset({ServerEvent.SESSION_QUEUED, ServerEvent.SESSION_QUEUE_UPDATE})
"""The queue's position events (``session.queue_done`` ends the wait)."""
TURN_QUEUE_EVENTS = {
    ServerEvent.SESSION_QUEUED: ServerEvent.RESPONSE_QUEUED,
    ServerEvent.SESSION_QUEUE_UPDATE: ServerEvent.RESPONSE_QUEUE_UPDATE,
}
"""The queue's events -> the names a waiting ``/v1/realtime`` chat turn hears them by."""
OFFICIAL_QUEUE_EVENTS = {
    ServerEvent.SESSION_QUEUED: OfficialEvent.QUEUED,
    ServerEvent.SESSION_QUEUE_UPDATE: OfficialEvent.QUEUE_UPDATE,
}
"""The queue's events -> the official ``/ws/duplex`` names."""

EXTENSIONS: frozenset[str] = frozenset(
    {
        ClientEvent.SESSION_RESUME,
        ClientEvent.CLIENT_DIAGNOSTIC,
        ServerEvent.RESPONSE_QUEUED,
        ServerEvent.RESPONSE_QUEUE_UPDATE,
        ServerEvent.RESPONSE_QUEUE_DONE,
        ServerEvent.SESSION_RESUMED,
        ServerEvent.SESSION_RESYNC_REQUIRED,
        ServerEvent.SESSION_RECOVERING,
        ServerEvent.SESSION_RECOVERED,
        ServerEvent.SESSION_ROLLOVER,
        ServerEvent.SESSION_EXPIRING,
    }
)
"""The ``/v1/realtime`` names omniserve adds to the spec's (docs/PROTOCOL.md)."""

__all__ = [
    "CURRENT_CLIENT_EVENTS",
    "CURRENT_ONLY",
    "CURRENT_SERVER_EVENTS",
    "EXTENSIONS",
    "INIT_EVENTS",
    "OFFICIAL_QUEUE_EVENTS",
    "OLDER_CLIENT_EVENTS",
    "OLDER_ONLY",
    "OLDER_SERVER_EVENTS",
    "QUEUE_EVENTS",
    "TURN_QUEUE_EVENTS",
    "ClientEvent",
    "ContentType",
    "DeltaKind",
    "LegacyChatEvent",
    "OfficialClientEvent",
    "OfficialEvent",
    "ServerEvent",
]
