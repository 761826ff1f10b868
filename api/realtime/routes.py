"""The WebSocket routes: ``/v1/realtime`` (one handler per mode) and the legacy ``/ws/chat``.

Each accepts the socket with the client's subprotocol, then asks the security policy
(``let_in``: key, origin, per-client and per-gateway connection limits) before anything else;
a denial is rendered in the endpoint's own dialect.
"""

from __future__ import annotations

from typing import Protocol

from fastapi import APIRouter, WebSocket
from starlette.status import WS_1008_POLICY_VIOLATION, WS_1013_TRY_AGAIN_LATER

from api.gateway.state import Gateway
from api.metrics import telemetry
from api.protocol.dialects import legacy_error
from api.protocol.errors import Frame
from api.realtime.chat import RealtimeChat
from api.realtime.connection import choose_subprotocol, refuse, refuse_with_error
from api.realtime.duplex import RealtimeDuplex
from api.realtime.legacy_chat import LegacyChat
from api.realtime.session import RealtimeSession
from api.security.policy import SecurityPolicy, let_in
from streaming.events import ErrorCode

MODES = {"chat", "video", "audio"}


class OtherProtocol(Protocol):
    """The session of a client that names a ``model`` and no ``mode``: the OpenAI Realtime
    protocol (``api/openai_realtime``), given by the app, which sits above both."""

    def __call__(self, gateway: Gateway, ws: WebSocket, model: str) -> RealtimeSession: ...

    def refusal(self, code: ErrorCode, message: str) -> Frame:
        """The protocol's own error event for a connection refused before its session."""
        ...


def create_router(security: SecurityPolicy, by_model: OtherProtocol | None = None) -> APIRouter:
    """``/v1/realtime`` and ``/ws/chat``, let in by ``security``; ``/v1/realtime?model=...``
    without a ``mode`` gets a ``by_model`` session when given."""
    router = APIRouter()

    @router.websocket("/v1/realtime")
    async def realtime(ws: WebSocket, mode: str | None = None, model: str | None = None) -> None:
        gateway: Gateway = ws.app.state.gateway
        await ws.accept(subprotocol=choose_subprotocol(ws))
        state = ws.app.state
        async with let_in(ws, security, state.connections, state.connection_cap) as denied:
            other = by_model if mode is None and model else None
            if denied is not None:
                code, message, close_code = denied.code, denied.message, denied.close_code
                telemetry.rejected(gateway.metrics, code)
                if other is not None:
                    return await refuse(ws, other.refusal(code, message), close_code)
                return await refuse_with_error(ws, code, message, close_code)
            if other is not None and model:
                return await _by_model(ws, gateway, other, model)
            await _realtime(ws, gateway, mode or "video")

    @router.websocket("/ws/chat")
    async def legacy_chat(ws: WebSocket) -> None:
        gateway: Gateway = ws.app.state.gateway
        await ws.accept(subprotocol=choose_subprotocol(ws))
        state = ws.app.state
        async with let_in(ws, security, state.connections, state.connection_cap) as denied:
            if denied is not None:
                telemetry.rejected(gateway.metrics, denied.code)
                return await refuse(ws, legacy_error(denied.message), denied.close_code)
            await LegacyChat(gateway, ws).serve()

    return router


async def _by_model(ws: WebSocket, gateway: Gateway, by_model: OtherProtocol, model: str) -> None:
    """A client of the other protocol, let in: its session, unless the gateway drains."""
    if gateway.shutting_down:
        telemetry.rejected(gateway.metrics, "shutting_down")
        frame = by_model.refusal(ErrorCode.SERVICE_UNAVAILABLE, "server is shutting down")
        return await refuse(ws, frame, WS_1013_TRY_AGAIN_LATER)
    await by_model(gateway, ws, model[:128]).serve()


async def _realtime(ws: WebSocket, gateway: Gateway, mode: str) -> None:
    """A ``/v1/realtime`` client let in: its mode's session, unless the mode is unknown or
    the gateway drains."""
    if mode not in MODES:
        telemetry.rejected(gateway.metrics, "invalid_mode")
        return await refuse_with_error(
            ws,
            ErrorCode.INVALID_PAYLOAD,
            "mode must be chat, video or audio",
            WS_1008_POLICY_VIOLATION,
            field="mode",
        )
    if gateway.shutting_down:
        telemetry.rejected(gateway.metrics, "shutting_down")
        return await refuse_with_error(
            ws,
            ErrorCode.SERVICE_UNAVAILABLE,
            "server is shutting down",
            WS_1013_TRY_AGAIN_LATER,
        )
    session = RealtimeChat(gateway, ws) if mode == "chat" else RealtimeDuplex(gateway, ws, mode)
    await session.serve()
