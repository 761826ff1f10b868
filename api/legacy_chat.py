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

from api.chat_turn import ChatTurn
from api.connection import Connection, parse_json
from api.dialects import LegacyChatMapper, legacy_error
from api.errors import ProtocolError
from api.gateway import Gateway
from api.recordings import record_turn
from api.slot_wait import Refused, wait_for_slot
from api.task_relay import TaskNotStarted, WorkerLost
from api.validation import LEGACY_CHAT_DEFAULTS, chat_request
from streaming.events import ErrorCode

REQUEST_TIMEOUT_S = 60.0


class LegacyChat(Connection):
    """One request, one answer, then close."""

    def __init__(self, gw: Gateway, ws: WebSocket) -> None:
        super().__init__(gw, ws)
        self.turn_id = f"chat_{uuid.uuid4().hex[:12]}"
        self.deadline = time.time() + gw.settings.legacy_chat_timeout_s
        self.request: asyncio.Future[dict[str, Any] | ProtocolError] = (
            asyncio.get_running_loop().create_future()
        )

    def stopping(self) -> bool:
        """The client left, or the request's deadline passed."""
        return self.gone.is_set() or time.time() >= self.deadline

    async def fail(self, message: str, code: int = status.WS_1000_NORMAL_CLOSURE) -> None:
        """Send the endpoint's error frame and close."""
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
                voices_dir=self.gw.settings.voices_dir,
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
        got = await wait_for_slot(self, self.deadline)
        if got is None:
            if not self.gone.is_set():
                await self.fail("timed out waiting for a worker")
            return
        if isinstance(got, Refused):
            full = got.code in (ErrorCode.QUEUE_FULL, ErrorCode.WORKER_BUSY)
            message = "Queue full" if full else f"service unavailable: {got.detail}"
            return await self.fail(message, status.WS_1013_TRY_AGAIN_LATER)
        if got.waited:
            await self.send({"type": "session.queue_done"})
        turn = ChatTurn(self.gw, self.turn_id, got, request, self.deadline)
        mapper = LegacyChatMapper(self.turn_id)
        try:
            async with aclosing(turn.events(self.stopping)) as events:
                async for ev in events:
                    for frame in mapper.frames(ev):
                        if frame["type"] == "done":
                            await record_turn(
                                self.gw.settings.recordings_dir, self.turn_id, request, frame
                            )
                        await self.send(frame)
                        if frame["type"] in mapper.ENDING:
                            return await self.close()
        except TaskNotStarted:
            return await self.fail("worker connection failed", status.WS_1013_TRY_AGAIN_LATER)
        except WorkerLost:
            return await self.fail("the worker running this request was lost")
        if not self.gone.is_set():
            timed_out = time.time() >= self.deadline
            await self.fail(
                "generation timed out" if timed_out else "generation ended without a result"
            )
