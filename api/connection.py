"""What every WebSocket connection handler shares: framing, sending, the receive loop."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import orjson
from starlette.websockets import WebSocket, WebSocketState

from api.errors import CLOSE_UNSUPPORTED_DATA, ProtocolError, error_frame
from api.gateway import Gateway

log = logging.getLogger("omniserve.gateway")


class NotJSON(Exception):
    """A frame that is not JSON text: the socket closes with 1003."""


def new_session_id() -> str:
    """``rt_<timestamp_ms>_<random>``: unique across gateways and concurrent connects."""
    return f"rt_{int(time.time() * 1000)}_{random.getrandbits(40):010x}"


def choose_subprotocol(ws: WebSocket) -> str | None:
    """Answer the client's subprotocol offer (the SDK offers ``map.realtime``)."""
    offered = ws.scope.get("subprotocols") or []
    if "map.realtime" in offered:
        return "map.realtime"
    return offered[0] if offered else None


def authorised(ws: WebSocket, api_keys: list[str]) -> bool:
    """Bearer token or ``api_key`` query parameter, when keys are configured."""
    if not api_keys:
        return True
    header = ws.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else None
    token = token or ws.query_params.get("api_key")
    return token in api_keys


class Connection:
    """A client WebSocket with ordered, locked sends and JSON framing."""

    def __init__(self, gw: Gateway, ws: WebSocket) -> None:
        self.gw = gw
        self.ws = ws
        self.send_lock = asyncio.Lock()
        self.gone = asyncio.Event()  # the client disconnected (or we closed the socket)
        self.closed_sent = False

    async def send(self, frame: dict[str, Any]) -> None:
        """Send one JSON text frame (silently dropped once the client is gone)."""
        if self.gone.is_set():
            return
        data = orjson.dumps(frame).decode()
        async with self.send_lock:
            if self.ws.application_state != WebSocketState.CONNECTED:
                return
            try:
                await self.ws.send_text(data)
                self.gw.counters["frames_out_total"] += 1
            except Exception:  # noqa: BLE001 - the peer went away mid-send
                self.gone.set()

    async def send_error(self, code: str, message: str, field: str | None = None) -> None:
        await self.send(error_frame(code, message, field))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the socket once."""
        async with self.send_lock:
            if self.ws.application_state == WebSocketState.CONNECTED:
                try:
                    await self.ws.close(code=code, reason=reason)
                except Exception:  # noqa: BLE001
                    pass
        self.gone.set()

    async def receive(self) -> dict[str, Any] | None:
        """The next client event as a dict; None when the client disconnected.

        Raises NotJSON for a frame that is not JSON text, ProtocolError for JSON that is not an
        event object.
        """
        msg = await self.ws.receive()
        if msg["type"] == "websocket.disconnect":
            self.gone.set()
            return None
        text = msg.get("text")
        if text is None:
            raise NotJSON("binary frames are not accepted; send JSON text frames")
        try:
            event = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise NotJSON("frame is not valid JSON") from None
        if not isinstance(event, dict):
            raise ProtocolError(
                "invalid_payload", "an event must be a JSON object with a type field", "type"
            )
        if "type" not in event:
            raise ProtocolError("missing_field", "missing required field type", "type")
        if not isinstance(event["type"], str):
            raise ProtocolError("invalid_payload", "type must be a string", "type")
        return event

    async def reject_frame(self, exc: NotJSON) -> None:
        """Close with 1003 for a non-JSON frame."""
        await self.close(CLOSE_UNSUPPORTED_DATA, str(exc)[:120])
