"""``/v1/realtime?mode=chat``: turns run one at a time, each taking its own place in the queue.

The connection holds no worker slot between turns: ``session.queue_done`` is sent at once, and
each ``input.append`` waits in the global FIFO and runs as one ``ChatTurn``.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import aclosing
from typing import Any

from starlette import status
from starlette.websockets import WebSocket

from api.chat_turn import ChatTurn
from api.dialects import ChatMapper
from api.errors import ProtocolError
from api.gateway import Gateway
from api.realtime import INIT_EVENTS, RealtimeSession, SessionState
from api.task_relay import TaskNotStarted, WorkerLost
from api.validation import REALTIME_CHAT_DEFAULTS, chat_request
from streaming.events import Closed, ErrorCode


class ChatSession(RealtimeSession):
    """Chat mode: turns run one at a time, each taking its own place in the global queue."""

    def __init__(self, gw: Gateway, ws: WebSocket) -> None:
        super().__init__(gw, ws, "chat")
        self.turns: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.turn_count = 0

    async def on_event(self, event: dict[str, Any]) -> None:
        """Handle one client event according to the current state."""
        kind = self.accept_event(event)
        if kind is None:
            return
        if kind in INIT_EVENTS:
            if self.state is not SessionState.CONNECTED:
                raise ProtocolError(
                    ErrorCode.INVALID_PAYLOAD, "session already initialised", "type"
                )
            field = "payload" if kind == "session.init" else "session"
            if field not in event:
                raise ProtocolError(
                    ErrorCode.MISSING_FIELD, f"missing required field {field}", field
                )
            if not isinstance(event[field], dict):
                raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{field} must be an object", field)
            self.state = SessionState.ACTIVE
            await self.send(
                {
                    "type": "session.created",
                    "session_id": self.session_id,
                    "mode": "turn_based",
                    "metrics": {},
                }
            )
            return
        if self.state is not SessionState.ACTIVE:
            raise ProtocolError(ErrorCode.NOT_READY, "send input only after session.created")
        if kind != "input.append":
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, "chat mode takes input.append", "type")
        if "input" not in event:
            raise ProtocolError(ErrorCode.MISSING_FIELD, "missing required field input", "input")
        voices = self.gw.settings.voices_dir
        self.turns.put_nowait(
            chat_request(event["input"], REALTIME_CHAT_DEFAULTS, voices_dir=voices)
        )

    async def run(self) -> None:
        self.state = SessionState.CONNECTED
        await self.send({"type": "session.queue_done", "session_id": self.session_id})
        while True:
            get = asyncio.ensure_future(self.turns.get())
            gone = asyncio.ensure_future(self.gone.wait())
            close = asyncio.ensure_future(self.close_wanted.wait())
            done, _ = await asyncio.wait(
                {get, gone, close}, timeout=self.time_left(), return_when=asyncio.FIRST_COMPLETED
            )
            for t in (gone, close):
                t.cancel()
            if get not in done:
                get.cancel()
                if not self.gone.is_set():
                    await self.finish(*self.end_reason())
                return
            if not await self.turn(get.result()):
                return

    async def turn(self, request: dict[str, Any]) -> bool:
        """Run one turn through the queue and a worker; False when the session ended."""
        admitted = await self.acquire_slot()
        if admitted is None:
            return False
        self.turn_count += 1
        self.slot_id = admitted.slot_id
        if admitted.waited:
            await self.send({"type": "session.queue_done", "session_id": self.session_id})
        turn = ChatTurn(
            self.gw, f"{self.session_id}_t{self.turn_count}", admitted, request, self.deadline
        )
        mapper = ChatMapper(self.session_id, f"resp_{uuid.uuid4().hex[:12]}")
        try:
            async with aclosing(turn.events(self.stopping)) as events:
                async for ev in events:
                    if isinstance(ev, Closed):
                        # the worker ended the turn early (drain, deadline, cancel)
                        if not self.stopping():
                            await self.send_error(
                                ErrorCode.INFERENCE_ERROR, f"turn interrupted: {ev.reason}"
                            )
                        continue
                    for frame in mapper.frames(ev):
                        await self.send(frame)
        except TaskNotStarted as exc:
            await self.send_error(
                ErrorCode.WORKER_CONNECT_FAILED, f"Worker connection failed: {exc.detail}"
            )
            await self.close(status.WS_1013_TRY_AGAIN_LATER)
            return False
        except WorkerLost:
            await self.send_error(
                ErrorCode.INFERENCE_ERROR, "the worker running this turn was lost"
            )
            return True
        finally:
            self.slot_id = None
        if not self.stopping():
            return True
        if not self.gone.is_set():
            await self.finish(*self.end_reason())
        return False
