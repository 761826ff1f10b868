"""``/v1/realtime`` video and audio: one long task pinned to one worker slot.

States (docs/PROTOCOL.md): QUEUED until a slot is assigned, CONNECTED until a valid init,
INITIALIZING until the worker's ``Created``, ACTIVE until ``Closed``; then CLOSED.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette import status
from starlette.websockets import WebSocket

from api.dialects import Dialect, DuplexMapper
from api.errors import ProtocolError
from api.gateway import Gateway
from api.realtime import INIT_EVENTS, RealtimeSession, SessionState
from api.task_relay import TaskNotStarted, TaskRelay, WorkerLost
from api.validation import duplex_append, duplex_init
from streaming.controls import CloseControl
from streaming.events import Closed, CloseReason, Created, Error, ErrorCode, Event
from streaming.input import AudioChunk
from streaming.jobs import DuplexJob

log = logging.getLogger("omniserve.gateway")

CLOSE_GRACE_S = 5.0  # a worker that does not confirm a close within this is not waited for


class DuplexSession(RealtimeSession):
    """Video / audio full-duplex: one long task pinned to one worker slot."""

    def __init__(self, gw: Gateway, ws: WebSocket, public_mode: str) -> None:
        super().__init__(gw, ws, public_mode)
        self.mapper: DuplexMapper | None = None
        self.input_seq = 0
        self.default_slices = 1
        self.init_since: float | None = None

    # ------------------------------------------------------------------ client side
    async def on_event(self, event: dict[str, Any]) -> None:
        """Handle one client event according to the current state."""
        kind = self.accept_event(event)
        S = SessionState
        if kind is None:
            if self.state in (S.CONNECTED, S.INITIALIZING, S.ACTIVE):
                await self.gw.inputs.control(
                    self.session_id, CloseControl(reason=self.close_reason)
                )
            return
        if self.state is S.QUEUED:
            raise ProtocolError(
                ErrorCode.NOT_READY, f"wait for session.queue_done before sending {kind}"
            )
        if kind in INIT_EVENTS:
            if self.state is not S.CONNECTED:
                raise ProtocolError(
                    ErrorCode.INVALID_PAYLOAD, "session already initialised", "type"
                )
            init = duplex_init(event)
            self.default_slices = init.max_slice_nums or 1
            self.state = S.INITIALIZING
            self.init_since = time.monotonic()
            await self.gw.inputs.control(self.session_id, init.control())
            return
        # input.append / input_audio_buffer.append
        if self.state is not S.ACTIVE:
            raise ProtocolError(ErrorCode.NOT_READY, "send input only after session.created")
        chunk = duplex_append(event, self.default_slices)
        self.input_seq += 1
        await self.gw.inputs.append(
            self.session_id,
            AudioChunk(
                seq=self.input_seq,
                input_id=f"input_{self.input_seq}",
                audio=chunk.audio,
                frames=chunk.frames[: self.gw.settings.max_video_frames],
                force_listen=chunk.force_listen,
                max_slice_nums=chunk.max_slice_nums,
            ),
        )

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        admitted = await self.acquire_slot()
        if admitted is None:
            return
        slot = self.slot_id = admitted.slot_id
        out = await self.gw.bus.open(self.session_id)  # before the worker can emit anything
        relay = TaskRelay(self.gw, out, self.session_id, slot, "session")
        try:
            try:
                await relay.submit(
                    DuplexJob(
                        session_id=self.session_id,
                        slot_id=slot,
                        gateway_id=self.gw.gateway_id,
                        public_mode=self.public_mode,
                        deadline_ts=self.deadline,
                    )
                )
            except TaskNotStarted as exc:
                log.warning("submitting %s failed: %s", self.session_id, exc.detail)
                await self.send_error(
                    ErrorCode.WORKER_CONNECT_FAILED, f"Worker connection failed: {exc.detail}"
                )
                await self.close(status.WS_1013_TRY_AGAIN_LATER)
                return
            self.gw.counters["sessions_total"] += 1
            self.state = SessionState.CONNECTED
            await self.send({"type": "session.queue_done", "session_id": self.session_id})
            await self.relay(relay)
        finally:
            await self.gw.bus.close(self.session_id)
            if self.gone.is_set() and not self.closed_sent:
                await self._tell_worker(CloseReason.CLIENT_CLOSED)  # the client vanished

    async def relay(self, relay: TaskRelay) -> None:
        """Forward worker events until the session closes."""
        closing_since: float | None = None
        while True:
            if self.gone.is_set():
                return
            if closing_since is None and (self.close_wanted.is_set() or self.time_left() <= 0):
                closing_since = time.monotonic()
                reason, code = self.end_reason()
                if reason != self.close_reason:  # a client's close went with its event
                    await self.gw.inputs.control(self.session_id, CloseControl(reason=reason))
                if self.shutdown_reason or not relay.started:
                    if not relay.started:
                        await self.gw.abandon(self.session_id, relay.slot_id)
                    return await self.finish(reason, code)
            if closing_since is not None and time.monotonic() - closing_since > CLOSE_GRACE_S:
                return await self.finish(self.end_reason()[0])
            timeout = 0.5 if closing_since is None else 0.25
            if closing_since is None:
                timeout = max(0.01, min(timeout, self.time_left()))
            try:
                events = await relay.next(timeout)
            except TaskNotStarted as exc:
                await self.send_error(
                    ErrorCode.WORKER_CONNECT_FAILED, f"Worker connection failed: {exc.detail}"
                )
                self.closed_sent = True
                return await self.close(status.WS_1013_TRY_AGAIN_LATER)
            except WorkerLost:
                await self.send_error(
                    ErrorCode.BACKEND_ERROR, "the worker running this session was lost"
                )
                return await self.finish(CloseReason.BACKEND_ERROR, status.WS_1011_INTERNAL_ERROR)
            for ev in events:
                if await self.handle(ev):
                    return
            if self._init_overdue():
                limit = self.gw.settings.init_timeout_s
                await self._tell_worker(CloseReason.BACKEND_ERROR)
                await self.send_error(
                    ErrorCode.BACKEND_ERROR,
                    f"the backend did not prepare the session within {limit:.0f} s",
                )
                return await self.finish(CloseReason.BACKEND_ERROR, status.WS_1011_INTERNAL_ERROR)

    def _init_overdue(self) -> bool:
        return (
            self.state is SessionState.INITIALIZING
            and self.init_since is not None
            and time.monotonic() - self.init_since > self.gw.settings.init_timeout_s
        )

    async def handle(self, ev: Event) -> bool:
        """Send one worker event to the client; True when the session is over."""
        if self.mapper is None:
            self.mapper = DuplexMapper(self.dialect or Dialect.CURRENT, self.session_id)
        match ev:
            case Closed():
                await self.finish(self.shutdown_reason or ev.reason or CloseReason.ERROR)
                return True
            case Created():
                self.state = SessionState.ACTIVE
            case Error(code=ErrorCode.INVALID_PAYLOAD) if self.state is SessionState.INITIALIZING:
                self.state = SessionState.CONNECTED  # the init was refused; the client may retry
        for frame in self.mapper.frames(ev):
            await self.send(frame)
        return False

    async def _tell_worker(self, reason: CloseReason) -> None:
        try:
            await self.gw.inputs.control(self.session_id, CloseControl(reason=reason))
        except Exception:
            log.warning("could not stop %s", self.session_id, exc_info=True)

    async def shutdown(self) -> None:
        await super().shutdown()
        if self.state is not SessionState.QUEUED and not self.gone.is_set():
            await self._tell_worker(CloseReason.SERVER_SHUTDOWN)
