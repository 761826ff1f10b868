"""Where the gateway's metrics move: one call at each point of the relay and of a session's life.

The handlers (``api/realtime/``) call these functions and nothing else of
``api/metrics/registry.py``, so that a relay point holds one line about metrics. Times are
``time.monotonic()`` unless named ``_ts`` (unix seconds, comparable with the worker's
``emitted_at``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from api.metrics.registry import GatewayMetrics
from api.protocol.errors import ErrorType
from api.protocol.events import LegacyChatEvent, ServerEvent
from streaming.events import (
    AudioDelta,
    CloseReason,
    Done,
    ErrorCode,
    Event,
    Gap,
    Listen,
    Speak,
    TextDelta,
)

log = logging.getLogger("omniserve.sessions")

# Worker clocks may run a little ahead of the gateway's; a negative latency is a skew, not data.
_MAX_RELAY_S = 60.0


@dataclass
class ResponseClock:
    """Time to first text and first audio of each response of one session.

    A response starts when the input that it answers was sent: a duplex input chunk (the
    worker's events carry its ``input_id``), or a chat turn. Its first text and its first audio
    are observed once each.
    """

    mode: str
    inputs: dict[str, float] = field(default_factory=dict)  # input id / turn -> monotonic sent
    responses: dict[str, tuple[float, set[str]]] = field(default_factory=dict)  # -> start, seen
    dropped: int = 0  # the worker's running count of dropped input chunks, as last reported

    def input_sent(self, key: str) -> None:
        """A response may start from this input (most duplex chunks are only listened to)."""
        _bounded_put(self.inputs, key, time.monotonic())

    def first(self, m: GatewayMetrics, response: str, start_key: str | None, kind: str) -> None:
        """``kind`` ("text"/"audio") of ``response`` was sent; observe it if it is the first."""
        entry = self.responses.get(response)
        if entry is None:
            started = self.inputs.get(start_key) if start_key is not None else None
            if started is None:
                return  # not an input this gateway saw sent (or long forgotten)
            entry = (started, set())
            _bounded_put(self.responses, response, entry)
        started, seen = entry
        if kind in seen:
            return
        seen.add(kind)
        hist = m.first_text if kind == "text" else m.first_audio
        hist.labels(self.mode).observe(max(0.0, time.monotonic() - started))


def _bounded_put(d: dict[str, Any], key: str, value: Any, limit: int = 256) -> None:
    """Insert into an insertion-ordered map, forgetting the oldest entries past ``limit``."""
    d[key] = value
    while len(d) > limit:
        d.pop(next(iter(d)))


def mode_of(conn: Any) -> str:
    """The public mode a connection's metrics go under (``/ws/chat`` counts as chat)."""
    mode = getattr(conn, "public_mode", "chat")
    return mode if isinstance(mode, str) else "chat"


# plain strings: this runs for every frame, and an enum member's lookup costs more than the check
_ERROR: str = ServerEvent.ERROR.value  # (every dialect's error frame is "error")
_SERVER_ERROR: str = ErrorType.SERVER_ERROR.value


def frame_sent(m: GatewayMetrics, frame: dict[str, Any]) -> str | None:
    """Every frame to a client: count the ``error`` events by code (legacy string errors as
    ``legacy``); returns the code of a server error (what a session that ends without
    ``session.closed`` is counted under)."""
    if frame.get("type") != _ERROR:
        return None
    err = frame.get("error")
    code = str(err.get("code")) if isinstance(err, dict) else "legacy"
    m.errors.labels(code).inc()
    server = isinstance(err, dict) and err.get("type") == _SERVER_ERROR
    return code if server else None


def rejected(m: GatewayMetrics, reason: str) -> None:
    """A connection refused before it had a session (auth, origin, limits, queue, shutdown)."""
    m.rejected.labels(reason).inc()


def admitted(m: GatewayMetrics, mode: str, waited_since: float) -> None:
    """A worker slot was assigned after waiting since ``waited_since``."""
    m.queue_wait.labels(mode).observe(max(0.0, time.monotonic() - waited_since))


def handed_off(m: GatewayMetrics, assigned_at: float | None) -> None:
    """A queued client was told ``session.queue_done``; its ticket was assigned at
    ``assigned_at`` (None: it never waited, nothing to measure)."""
    if assigned_at is not None:
        m.admission_handoff.observe(max(0.0, time.monotonic() - assigned_at))


def relayed(m: GatewayMetrics, clock: ResponseClock, ev: Event, key: str | None = None) -> None:
    """One worker event was sent to the client: relay latency, first text/audio, gaps, drops.

    ``key`` names the response for chat events (the turn); duplex events carry their input id.
    """
    if ev.emitted_at:
        latency = time.time() - ev.emitted_at
        if 0.0 <= latency < _MAX_RELAY_S:
            m.relay_latency.observe(latency)
    match ev:
        case Gap():
            m.output_gaps.inc()
        case Speak():
            if ev.text:
                clock.first(m, ev.response_id, ev.input_id, "text")
            if ev.audio:
                clock.first(m, ev.response_id, ev.input_id, "audio")
            _drops(m, clock, ev.metrics)
        case Listen():
            _drops(m, clock, ev.metrics)
        case TextDelta() if key is not None:
            clock.first(m, key, key, "text")
        case AudioDelta() if key is not None:
            clock.first(m, key, key, "audio")
        case Done() if key is not None:
            if ev.text:
                clock.first(m, key, key, "text")
            if ev.audio or ev.last_audio:
                clock.first(m, key, key, "audio")
        case _:
            pass


def _drops(m: GatewayMetrics, clock: ResponseClock, metrics: dict[str, Any]) -> None:
    total = metrics.get("dropped_chunks")
    if isinstance(total, int) and total > clock.dropped:
        m.input_dropped.labels(clock.mode).inc(total - clock.dropped)
        clock.dropped = total


# Close reasons that are ours (a /ws/chat connection ends with the frame it ended on); a client's
# own session.close reason is free text, counted as one label value so that clients cannot create
# series at will.
_LEGACY_ENDINGS = {LegacyChatEvent.DONE, LegacyChatEvent.ERROR}
_OUR_REASONS = frozenset(CloseReason) | frozenset(ErrorCode) | _LEGACY_ENDINGS
CLIENT_REASON = "client_reason"


def close_label(reason: str) -> str:
    """The ``reason`` label of a close: our reasons as they are, a client's own as one value."""
    return reason if reason in _OUR_REASONS else CLIENT_REASON


class EndedSession(Protocol):
    """What the session-end line and the close counter read of a session handler."""

    session_id: str
    public_mode: str
    connected_at: float  # unix
    admitted_at: float | None  # unix, first slot assigned
    worker_id: str | None
    ended_reason: str | None  # what session.closed said; None when it was not sent
    last_server_error: str | None

    def session_goes_on(self) -> bool: ...


def session_ended(m: GatewayMetrics, s: EndedSession) -> None:
    """A session handler is done: count its close and write the one session-end line.

    A session that ended without ``session.closed`` (refused while queued, the worker never
    started it, the client vanished) is counted under the server error it was sent, else
    ``client_closed``. A connection whose session goes on (detached for a resume, replaced by
    one) ends no session.
    """
    if s.session_goes_on():  # detached for a resume, or replaced: the session itself goes on
        log.info("session %s: this connection ended, the session goes on", s.session_id)
        return
    reason = (s.ended_reason or s.last_server_error or CloseReason.CLIENT_CLOSED.value)[:64]
    m.closes.labels(s.public_mode, close_label(reason)).inc()
    now = time.time()
    queued = (s.admitted_at or now) - s.connected_at
    active = now - s.admitted_at if s.admitted_at else 0.0
    fields = {
        "event": "session_end",
        "mode": s.public_mode,
        "worker": s.worker_id,
        "reason": reason,
        "duration_s": round(now - s.connected_at, 3),
        "queued_s": round(queued, 3),
        "active_s": round(active, 3),
    }
    log.info(
        "session %s ended: %s",
        s.session_id,
        " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items() if k != "event"),
        extra={**fields, "session_id": s.session_id},
    )
