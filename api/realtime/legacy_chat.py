"""``WS /ws/chat``: the legacy turn-based endpoint (spec/05): one request per connection.

prefill_done {input_tokens} -> chunk {text_delta, audio_data}* -> done {...}; on any failure an
``error`` (a string) and the connection closes. The worker slot is released as soon as the turn
ends.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing
from typing import Any

from starlette import status
from starlette.websockets import WebSocket

from api.gateway.metering import request_usage
from api.gateway.state import Gateway
from api.gateway.waiting_events import WaitingTask
from api.metrics import telemetry
from api.protocol.chat_validation import LEGACY_CHAT_DEFAULTS, chat_request
from api.protocol.dialects import LegacyChatMapper, legacy_error
from api.protocol.errors import ProtocolError
from api.protocol.frames import queue_done
from api.realtime.chat_turn import ChatTurn
from api.realtime.connection import ClientSocket, parse_json
from api.realtime.slot_wait import NoSlot, wait_for_slot
from api.relay.task import TaskNotStarted, WorkerLost
from api.security.key_check import identity_of
from omnicore.logs import session_context
from streaming.controls import CloseControl
from streaming.events import CloseReason, ErrorCode
from streaming.jobs import ChatJob
from streaming.keys import slot_worker

REQUEST_TIMEOUT_S = 60.0


class LegacyChat(ClientSocket):
    """One request, one answer, then close."""

    def __init__(self, gateway: Gateway, ws: WebSocket) -> None:
        super().__init__(gateway, ws)
        self.turn_id = self.log_id = f"chat_{uuid.uuid4().hex[:12]}"
        self.turn_running = False
        self.recording = gateway.recorder.open(self.turn_id, "legacy_chat", endpoint="/ws/chat")
        self.deadline = time.time() + gateway.settings.legacy_chat_timeout_s
        # what the session-end line and the metrics read (telemetry.EndedSession)
        self.session_id = self.turn_id
        self.public_mode = "chat"
        self.connected_at = time.time()
        self.admitted_at: float | None = None
        self.worker_id: str | None = None
        self.ended_reason: str | None = None
        self.clock = telemetry.ResponseClock("chat")
        self.identity = identity_of(ws)
        self.meter = gateway.metering.open(self.identity, self.connected_at)
        self.request: asyncio.Future[dict[str, Any] | ProtocolError] = (
            asyncio.get_running_loop().create_future()
        )

    def stopping(self) -> bool:
        """The client left or stopped keeping up, or the request's deadline passed."""
        return self.gone.is_set() or bool(self.evict_reason) or time.time() >= self.deadline

    async def on_evict(self, reason: CloseReason) -> None:
        """Stop the turn now: its output has nowhere to go (api/gateway/client_watch.py)."""
        if self.turn_running:
            await self.gateway.inputs.control(self.turn_id, CloseControl(reason=reason))

    def session_goes_on(self) -> bool:
        """A turn ends with its connection."""
        return False

    def recording_info(self) -> dict[str, Any]:
        return {
            "key": self.identity.name,
            "usage": self.meter.session_usage(ended=True).as_dict(),
        }

    async def serve(self) -> None:
        """The turn, its log lines naming it, and its session-end line."""
        with session_context(self.turn_id):
            try:
                await super().serve()
            finally:
                telemetry.session_ended(self.gateway.metrics, self)
                await self.meter.close(False)

    async def fail(self, message: str, code: int = status.WS_1000_NORMAL_CLOSURE) -> None:
        """Send the endpoint's error frame and close."""
        self.ended_reason = self.ended_reason or "error"
        await self.send(legacy_error(message))
        await self.close(code)

    async def on_failure(self) -> None:
        await self.fail("internal error", status.WS_1011_INTERNAL_ERROR)

    # ------------------------------------------------------------------ receiving
    def decode(self, text: str | None) -> dict[str, Any] | None:
        """The request object (no ``type`` field needed); later frames are ignored."""
        if self.request.done():
            return None
        event = parse_json(text)
        return event if isinstance(event, dict) else {"messages": None}

    async def on_event(self, event: dict[str, Any]) -> None:
        try:
            result: dict[str, Any] | ProtocolError = chat_request(
                event,
                LEGACY_CHAT_DEFAULTS,
                prefix="request",
                voices_dir=self.gateway.settings.voices_dir,
            )
        except ProtocolError as exc:
            result = exc
        if not self.request.done():
            self.request.set_result(result)

    # ------------------------------------------------------------------ the turn
    async def run(self) -> None:
        gone = asyncio.ensure_future(self.gone.wait())
        waits: set[asyncio.Future[Any]] = {self.request, gone}
        done, _ = await asyncio.wait(
            waits, timeout=REQUEST_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
        gone.cancel()
        if self.request not in done:
            if not self.gone.is_set():
                await self.fail("no request received within 60 s")
            return
        request = self.request.result()
        if isinstance(request, ProtocolError):
            return await self.fail(f"{request.code}: {request.message}")
        await self.answer(request)

    async def answer(self, request: dict[str, Any]) -> None:
        """Queue for a slot, run the turn, relay it; then close."""
        refused = await self.meter.admit(self.session_id)
        if refused is not None:  # the key's quota: told before any slot is asked for
            telemetry.rejected(self.gateway.metrics, ErrorCode.QUOTA_EXCEEDED)
            self.ended_reason = "quota_exceeded"
            message = self.meter.refusal_message(refused)
            return await self.fail(message, status.WS_1008_POLICY_VIOLATION)
        asked = time.time()
        got = await wait_for_slot(self, self.deadline, task=WaitingTask(self.turn_id, ChatJob.task))
        if got is None:
            if not self.gone.is_set():
                await self.fail("timed out waiting for a worker")
            return
        if isinstance(got, NoSlot):
            full = got.code in (ErrorCode.QUEUE_FULL, ErrorCode.WORKER_BUSY)
            message = "Queue full" if full else f"service unavailable: {got.detail}"
            return await self.fail(message, status.WS_1013_TRY_AGAIN_LATER)
        self.admitted_at, self.worker_id = time.time(), slot_worker(got.slot_id)
        self.meter.queue_wait(self.admitted_at - asked)
        self.meter.add(request_usage(request))
        self.clock.input_sent(self.turn_id)
        if got.waited:
            await self.send(queue_done())
            telemetry.handed_off(self.gateway.metrics, got.assigned_at)
        turn = ChatTurn(
            self.gateway,
            self.turn_id,
            got,
            request,
            self.deadline,
            on_overflow=self.output_overflow,
        )
        mapper = LegacyChatMapper(self.turn_id)
        self.turn_running = True
        try:
            async with aclosing(turn.events(self.stopping, (self.gone,))) as events:
                async for ev in events:
                    self.meter.event(ev)
                    for frame in mapper.frames(ev):
                        await self.send(frame)
                        if frame["type"] in mapper.ENDING:
                            telemetry.relayed(self.gateway.metrics, self.clock, ev, self.turn_id)
                            self.ended_reason = self.ended_reason or frame["type"]
                            return await self.close()
                    telemetry.relayed(self.gateway.metrics, self.clock, ev, self.turn_id)
        except TaskNotStarted:
            return await self.fail("worker connection failed", status.WS_1013_TRY_AGAIN_LATER)
        except WorkerLost:
            return await self.fail("the worker running this request was lost")
        finally:
            self.turn_running = False
        if not self.gone.is_set():
            timed_out = time.time() >= self.deadline
            await self.fail(
                "generation timed out" if timed_out else "generation ended without a result"
            )
