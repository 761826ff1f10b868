"""``WS /ws/chat``: the legacy turn-based endpoint (spec/05): one request per connection.

prefill_done {input_tokens} -> chunk {text_delta, audio_data}* -> done {...}; on any failure an
``error`` then the connection closes. The worker slot is released as soon as the turn ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import aclosing
from typing import Any

import orjson
from starlette.websockets import WebSocket

from api import errors as E
from api.connection import Connection, NotJSON
from api.gateway import CHAT_TASK, Gateway
from api.recordings import record_turn
from api.turns import TurnLost, TurnNotStarted, turn_events
from api.validation import LEGACY_CHAT_DEFAULTS, chat_request
from streaming.admission import QueueFull
from streaming.output import SessionOutput

log = logging.getLogger("omniserve.gateway")


class LegacyChat(Connection):
    """One request, one answer, then close."""

    def __init__(self, gw: Gateway, ws: WebSocket) -> None:
        super().__init__(gw, ws)
        self.turn_id = f"chat_{uuid.uuid4().hex[:12]}"
        self.deadline = time.time() + gw.settings.legacy_chat_timeout_s

    async def fail(self, message: str, code: int = E.CLOSE_NORMAL) -> None:
        await self.send({"type": "error", "error": message})
        await self.close(code)

    async def run(self) -> None:
        try:
            event = await asyncio.wait_for(self.receive_any(), timeout=60)
        except TimeoutError:
            return await self.fail("no request received within 60 s")
        except NotJSON as exc:
            return await self.reject_frame(exc)
        if event is None:
            return
        try:
            request = chat_request(event, LEGACY_CHAT_DEFAULTS, prefix="request")
        except E.ProtocolError as exc:
            return await self.fail(f"{exc.code}: {exc.message}")
        watcher = asyncio.create_task(self._watch_disconnect())
        try:
            await self.answer(request)
        finally:
            watcher.cancel()

    async def receive_any(self) -> dict[str, Any] | None:
        """The request object (no ``type`` field needed on this endpoint)."""
        msg = await self.ws.receive()
        if msg["type"] == "websocket.disconnect":
            self.gone.set()
            return None
        if msg.get("text") is None:
            raise NotJSON("binary frames are not accepted; send JSON text frames")
        try:
            event = orjson.loads(msg["text"])
        except orjson.JSONDecodeError:
            raise NotJSON("frame is not valid JSON") from None
        if not isinstance(event, dict):
            return {"messages": None}
        return event

    async def _watch_disconnect(self) -> None:
        while not self.gone.is_set():
            msg = await self.ws.receive()
            if msg["type"] == "websocket.disconnect":
                self.gone.set()

    async def answer(self, request: dict[str, Any]) -> None:
        gw = self.gw
        try:
            ready = await gw.has_workers()
        except Exception:  # noqa: BLE001
            ready = False
        if not ready:
            await self.send({"type": "error", "error": "service unavailable: no worker is up"})
            return await self.close(E.CLOSE_TRY_AGAIN)
        acquire = asyncio.ensure_future(gw.queue.acquire(self.send))
        gone = asyncio.ensure_future(self.gone.wait())
        done, _ = await asyncio.wait(
            {acquire, gone},
            timeout=max(0.0, self.deadline - time.time()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        gone.cancel()
        if acquire not in done:
            acquire.cancel()
            try:
                await acquire
            except (asyncio.CancelledError, Exception):
                pass
            if not self.gone.is_set():
                await self.fail("timed out waiting for a worker")
            return
        try:
            _ticket, slot, waited = acquire.result()
        except QueueFull:
            await self.send({"type": "error", "error": "Queue full"})
            return await self.close(E.CLOSE_TRY_AGAIN)
        except Exception as exc:  # noqa: BLE001
            await self.send({"type": "error", "error": f"service unavailable: {exc}"})
            return await self.close(E.CLOSE_TRY_AGAIN)
        if waited:
            await self.send({"type": "session.queue_done"})
        out = await gw.bus.open(self.turn_id)
        gw.counters["chat_turns_total"] += 1
        try:
            await gw.submit(
                CHAT_TASK,
                slot,
                {
                    "turn_id": self.turn_id,
                    "slot_id": slot,
                    "gateway_id": gw.gateway_id,
                    "request": request,
                    "deadline_ts": self.deadline,
                },
            )
            await self.relay(out, slot, request)
        finally:
            await gw.bus.close(self.turn_id)

    async def relay(self, out: SessionOutput, slot: str, request: dict[str, Any]) -> None:
        """prefill_done -> chunk* -> done, or an error; then close."""
        gw = self.gw
        text = ""

        def stopping() -> bool:
            return self.gone.is_set() or time.time() >= self.deadline

        try:
            async with aclosing(turn_events(gw, out, self.turn_id, slot, stopping)) as events:
                async for ev in events:
                    kind = ev.get("type")
                    if kind == "prefill":
                        await self.send(
                            {"type": "prefill_done", "input_tokens": ev["input_tokens"]}
                        )
                    elif kind == "text":
                        text += ev["text"]
                        await self.send(
                            {"type": "chunk", "text_delta": ev["text"], "audio_data": None}
                        )
                    elif kind == "audio":
                        await self.send(
                            {"type": "chunk", "text_delta": "", "audio_data": ev["audio"]}
                        )
                    elif kind == "done":
                        # non-streaming: the whole speech; streaming: its final segment
                        audio = ev.get("audio") or ev.get("last_audio") or None
                        frame = {
                            "type": "done",
                            "text": ev.get("text", text),
                            "generated_tokens": ev.get("generated_tokens", 0),
                            "input_tokens": ev.get("input_tokens", 0),
                            "audio_data": audio,
                            "recording_session_id": self.turn_id,
                        }
                        await record_turn(gw.settings.recordings_dir, self.turn_id, request, frame)
                        await self.send(frame)
                        return await self.close()
                    elif kind == "error":
                        return await self.fail(ev.get("message") or ev.get("code") or "error")
                    elif kind == "closed":
                        return await self.fail("generation ended without a result")
        except TurnNotStarted:
            return await self.fail("worker connection failed", E.CLOSE_TRY_AGAIN)
        except TurnLost:
            return await self.fail("the worker running this request was lost")
        if not self.gone.is_set():
            await self.fail(
                "generation timed out"
                if time.time() >= self.deadline
                else "generation ended without a result"
            )
