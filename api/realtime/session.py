"""``WS /v1/realtime``: what every mode shares (framing, dialect, queueing, closing).

The modes themselves are ``RealtimeDuplex`` (video, audio: ``api/realtime/duplex.py``), which
holds one worker slot for the whole session, and ``RealtimeChat`` (``api/realtime/chat.py``),
which holds a slot only while a turn runs. Both subclass ``RealtimeSession`` and make their
session resumable with a ``SessionResume`` (``api/realtime/resume.py``) they own.
"""

from __future__ import annotations

import logging
import time
from enum import StrEnum
from typing import Any

from starlette import status
from starlette.websockets import WebSocket

from api.gateway.queueing import Notify
from api.gateway.state import Gateway
from api.gateway.waiting_events import WaitingTask
from api.metrics import telemetry
from api.protocol.diagnostics import ClientDiagnostics
from api.protocol.dialects import Dialect, dialect_of, older_close_reason
from api.protocol.errors import Frame, ProtocolError
from api.protocol.events import ClientEvent
from api.protocol.frames import session_closed
from api.realtime.connection import ClientSocket, Flag, new_session_id, parse_json
from api.realtime.slot_wait import Admitted, NoSlot, wait_for_slot
from api.security.key_check import identity_of
from api.security.policy import presented_key
from omnicore.logs import session_context
from streaming.events import CloseReason, ErrorCode
from streaming.keys import slot_worker

log = logging.getLogger("omniserve.gateway")

KNOWN_EVENTS = frozenset(ClientEvent) - {ClientEvent.CLIENT_DIAGNOSTIC}
"""The events a mode handles (a ``client_diagnostic`` is noted before it)."""


class SessionState(StrEnum):
    """docs/PROTOCOL.md, "State machine"."""

    QUEUED = "QUEUED"
    CONNECTED = "CONNECTED"
    INITIALIZING = "INITIALIZING"
    ACTIVE = "ACTIVE"
    RECOVERING = "RECOVERING"  # a new worker is being found for the session (failover)
    CLOSED = "CLOSED"


def no_slot_message(no_slot: NoSlot) -> str:
    """The ``/v1/realtime`` message of a wait for a slot that ended without one."""
    if no_slot.code is ErrorCode.QUEUE_FULL:
        return "Queue full"
    if no_slot.code is ErrorCode.WORKER_BUSY:
        return "No idle worker available"
    return f"Service is not ready: {no_slot.detail}"


class RealtimeSession(ClientSocket):
    """Base of both modes: framing, dialect, queue entry, timing, closing."""

    def __init__(self, gateway: Gateway, ws: WebSocket, public_mode: str) -> None:
        super().__init__(gateway, ws)
        self.public_mode = public_mode
        self.session_id = new_session_id()
        self.connected_at = time.time()
        self.log_id = self.session_id
        # the mode's limit, or the client's API key's own (``api_key_durations``), within its
        # named key's longest session
        self.identity = identity_of(ws)
        limit = gateway.settings.duration_limit(public_mode, presented_key(ws))
        if self.identity.quota.max_session_s is not None:
            limit = min(limit, self.identity.quota.max_session_s)
        self.deadline = self.connected_at + limit
        self.meter = gateway.metering.open(self.identity, self.connected_at)
        self._state = SessionState.QUEUED
        self.state_since = time.monotonic()
        self.dialect: Dialect | None = None
        self.slot_id: str | None = None  # the worker slot held now (chat: only during a turn)
        self.slot_since: float | None = None  # when the slot was assigned (chat: this turn's)
        self.close_reason: str | None = None  # set when the client asks to close
        self.close_wanted = Flag(self.wake_relay)
        self.superseded = Flag(self.wake_relay)  # the client resumes another session instead
        self.shutdown_reason: CloseReason | None = None
        self.clock = telemetry.ResponseClock(public_mode)  # first text/audio per response
        self.admitted_at: float | None = None  # unix time a worker slot was first assigned
        self.worker_id: str | None = None  # the worker of the last slot held
        self.ended_reason: str | None = None  # what session.closed said (None: not sent)
        self.diagnostics = ClientDiagnostics(self.session_id, gateway.metrics.client_playback_gaps)
        self.recording = gateway.recorder.open(
            self.session_id, public_mode, endpoint="/v1/realtime"
        )

    def recording_info(self) -> dict[str, Any]:
        # the reason the session ended with, also when its session.closed could not be sent
        return {
            "session_id": self.session_id,
            "dialect": self.dialect,
            "close_reason": self.ended_reason,
            "key": self.identity.name,
            "usage": self.meter.session_usage(ended=not self.session_goes_on()).as_dict(),
        }

    @property
    def state(self) -> SessionState:
        """docs/PROTOCOL.md, "State machine" (``state_since``: when it was entered)."""
        return self._state

    @state.setter
    def state(self, value: SessionState) -> None:
        self._state = value
        self.state_since = time.monotonic()

    def session_goes_on(self) -> bool:
        """Whether the session outlives this connection (a resumable one may: see
        ``api/realtime/resume.py``); then its end is neither counted nor logged here."""
        return False

    def adopt(self, session_id: str, deadline: float) -> None:
        """This connection now serves ``session_id``, taken over from another connection
        (``SessionResume.take_over``): registered under that id, on that session's clock,
        active, and never queued here (the session-end line)."""
        self.gateway.sessions.pop(self.session_id, None)
        self.session_id = session_id
        self.gateway.sessions[session_id] = self
        self.deadline = deadline
        self.state = SessionState.ACTIVE
        self.admitted_at = time.time()

    def time_left(self) -> float:
        """Seconds until the mode's duration limit (counted from connect)."""
        return max(0.0, self.deadline - time.time())

    def vanished(self) -> bool:
        """Whether the client left without asking to close. A ``session.close`` it sent is
        honoured even when its socket closed right after (a client may send it and close at
        once, without reading ``session.closed``): the session ends as asked, not detached."""
        return self.gone.is_set() and self.close_reason is None

    def stopping(self) -> bool:
        """Whether the session must end: the client left or asked to, shutdown, time is up."""
        return self.gone.is_set() or self.close_wanted.is_set() or self.time_left() <= 0

    def end_reason(self) -> tuple[str, int]:
        """Reason and close code for a session ended by shutdown, the client, or the clock."""
        if self.shutdown_reason:
            return self.shutdown_reason, status.WS_1001_GOING_AWAY
        if self.evict_reason is CloseReason.CLIENT_IDLE:
            return self.evict_reason, status.WS_1000_NORMAL_CLOSURE
        if self.evict_reason:
            return self.evict_reason, status.WS_1008_POLICY_VIOLATION
        if self.close_wanted.is_set():
            return self.close_reason or CloseReason.USER_STOP, status.WS_1000_NORMAL_CLOSURE
        return CloseReason.TIMEOUT, status.WS_1000_NORMAL_CLOSURE

    # ------------------------------------------------------------------ client events
    def decode(self, text: str | None) -> dict[str, Any]:
        """A client event: a JSON object with a string ``type``."""
        event = parse_json(text)
        if not isinstance(event, dict):
            raise ProtocolError(
                ErrorCode.INVALID_PAYLOAD,
                "an event must be a JSON object with a type field",
                "type",
            )
        if "type" not in event:
            raise ProtocolError(ErrorCode.MISSING_FIELD, "missing required field type", "type")
        if not isinstance(event["type"], str):
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, "type must be a string", "type")
        return event

    def accept_event(self, event: dict[str, Any]) -> str | None:
        """What every mode does first: note diagnostics, fix the dialect, refuse unknown types,
        note a close.

        Returns the event type for the mode to handle (``session.close`` only to let it tell its
        worker), or None when nothing is left to do (a ``client_diagnostic``).
        """
        kind: str = event["type"]
        if kind == ClientEvent.CLIENT_DIAGNOSTIC:  # any state; it does not choose the dialect
            self.diagnostics.note(event)
            return None
        if self.dialect is None:
            self.dialect = dialect_of(kind)
        if kind not in KNOWN_EVENTS:
            raise ProtocolError(ErrorCode.UNKNOWN_EVENT, f"unknown event type {kind!r}", "type")
        if kind == ClientEvent.SESSION_CLOSE:
            reason = event.get("reason")
            self.close_reason = (
                reason if isinstance(reason, str) and reason else CloseReason.USER_STOP
            )
            self.close_wanted.set()
        return kind

    async def on_event_failure(self, event: dict[str, Any]) -> None:
        await self.send_error(ErrorCode.INFERENCE_ERROR, "the server could not handle this event")

    # ------------------------------------------------------------------ queueing
    async def acquire_slot(
        self, task: WaitingTask, notify: Notify | None = None
    ) -> Admitted | None:
        """Wait for a worker slot for ``task``; None when the session ended instead (the client
        was told, unless it resumes another session: ``superseded``).

        The queue events go to the client, or to ``notify`` when given. The client's key's
        quota is checked first, once per connection (``quota_exceeded``, nothing held).
        """
        if not self.meter.admitted and not await self.quota_admits():
            return None
        since = time.time() if self.public_mode == "chat" else self.connected_at  # chat: a turn
        got = await wait_for_slot(
            self, self.deadline, self.close_wanted, self.superseded, notify=notify, task=task
        )
        if isinstance(got, Admitted):
            if self.superseded.is_set():  # the slot came with the resume request
                self.gateway.waiting_events.left(task)
                await self.gateway.admission.release(got.slot_id)
                return None
            self.admitted_at = self.admitted_at or time.time()
            self.meter.queue_wait(time.time() - since)
            self.worker_id = slot_worker(got.slot_id)
            self.slot_since = time.time()
            return got
        if self.superseded.is_set():
            return None
        if isinstance(got, NoSlot):
            message = no_slot_message(got)
            await self.send_error(got.code, message)
            unavailable = got.code is ErrorCode.SERVICE_UNAVAILABLE
            await self.close(
                status.WS_1013_TRY_AGAIN_LATER, "service unavailable" if unavailable else message
            )
        elif not self.vanished():
            await self.finish(*self.end_reason())
        return None

    async def quota_admits(self) -> bool:
        """Whether the key's quota lets this session in; if not, the client was told and the
        socket closed (a connection about to resume a session it has keeps that one's place)."""
        refused = await self.meter.admit(self.session_id)
        if refused is None or await self.resume_coming():
            return True
        telemetry.rejected(self.gateway.metrics, ErrorCode.QUOTA_EXCEEDED)
        await self.send_error(ErrorCode.QUOTA_EXCEEDED, self.meter.refusal_message(refused))
        self.closed_sent = True
        await self.close(status.WS_1008_POLICY_VIOLATION, "quota exceeded")
        return False

    async def resume_coming(self) -> bool:
        """Whether this connection turned out to resume another session (a subclass waits a
        moment for the client's first event)."""
        return self.superseded.is_set()

    # ------------------------------------------------------------------ closing
    async def finish(self, reason: str, code: int = status.WS_1000_NORMAL_CLOSURE) -> None:
        """Send session.closed (once) and close the socket."""
        if not self.closed_sent:
            self.closed_sent = True
            self.state = SessionState.CLOSED
            if self.dialect is Dialect.OLDER:
                reason = older_close_reason(reason, self.close_reason or CloseReason.USER_STOP)
            self.ended_reason = str(reason)
            await self.send(self.closed_frame(reason))
        elif self.ended_reason is None:  # a mode sent its own (chat: numbered, logged)
            self.ended_reason = str(reason)
        await self.close(code)

    def closed_frame(self, reason: str) -> Frame:
        """The ``session.closed`` server event (``usage``: an extension field)."""
        frame = session_closed(self.session_id, str(reason))
        frame["usage"] = self.meter.session_usage(ended=True).as_dict()
        return frame

    async def on_evict(self, reason: CloseReason) -> None:
        """The client stopped keeping up: the session ends with ``reason``
        (api/gateway/client_watch.py); the modes also tell the worker at once."""
        self.close_wanted.set()

    async def shutdown(self) -> None:
        """Server shutdown: tell the client, end the work."""
        self.shutdown_reason = CloseReason.SERVER_SHUTDOWN
        self.close_wanted.set()

    async def on_failure(self) -> None:
        if not self.closed_sent:
            await self.send_error(ErrorCode.BACKEND_ERROR, "internal gateway error")
            await self.finish(CloseReason.ERROR, status.WS_1011_INTERNAL_ERROR)

    async def serve(self) -> None:
        """Run the session, registered with the gateway (for shutdown) while it lives."""
        self.gateway.sessions[self.session_id] = self
        with session_context(self.session_id):
            try:
                await super().serve()
            finally:
                # (a connection that resumed this session on this gateway may be registered now)
                if self.gateway.sessions.get(self.session_id) is self:
                    del self.gateway.sessions[self.session_id]
                telemetry.session_ended(self.gateway.metrics, self)
                await self.meter.close(self.session_goes_on())
