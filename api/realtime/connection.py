"""The base of every WebSocket handler: it owns the receive loop and declares hooks.

Like starlette's ``WebSocketEndpoint``, ``ClientSocket`` reads the socket itself and calls the
subclass's hooks: ``decode`` (one text frame -> an event, or None to ignore it), ``on_event``,
``on_client_error`` and ``on_event_failure``. Unlike it, the session's own work (``run``: queueing,
relaying the worker) runs beside the receive loop, because a client may send while its output
streams. ``serve`` runs both and cleans up on every exit; sends are ordered and stop once the
client is gone. ``run``, ``decode`` and ``on_event`` are abstract: every handler has its own.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import orjson
from starlette import status
from starlette.websockets import WebSocket, WebSocketState

from api.gateway import client_watch
from api.gateway.state import Gateway
from api.metrics import telemetry
from api.protocol.errors import Frame, ProtocolError, error_frame
from api.recordings.recorder import OFF, SessionRecording
from streaming.events import CloseReason, ErrorCode

log = logging.getLogger("omniserve.gateway")


class NotJSON(Exception):
    """A frame that is not JSON text: the socket closes with 1003."""


def new_session_id() -> str:
    """``rt_<timestamp_ms>_<random>``: unique across gateways and concurrent connects."""
    return f"rt_{int(time.time() * 1000)}_{random.getrandbits(40):010x}"


def choose_subprotocol(ws: WebSocket) -> str | None:
    """Answer the client's subprotocol offer (the SDK offers ``map.realtime``)."""
    offered: list[str] = ws.scope.get("subprotocols") or []
    if "map.realtime" in offered:
        return "map.realtime"
    return offered[0] if offered else None


async def refuse(ws: WebSocket, frame: Frame, close_code: int) -> None:
    """Answer an accepted socket that will not get a session: one frame, then close."""
    await ws.send_json(frame)
    await ws.close(close_code)


async def refuse_with_error(
    ws: WebSocket, code: ErrorCode, message: str, close_code: int, field: str | None = None
) -> None:
    """``refuse`` with the ``error`` frame of ``/v1/realtime``."""
    await refuse(ws, error_frame(code, message, field), close_code)


def parse_json(text: str | None) -> Any:
    """The JSON value of a text frame; NotJSON for a binary frame or invalid JSON."""
    if text is None:
        raise NotJSON("binary frames are not accepted; send JSON text frames")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raise NotJSON("frame is not valid JSON") from None


class Flag(asyncio.Event):
    """An ``asyncio.Event`` that calls ``on_set`` when it becomes set: a session's relay loop
    sleeps until its next event, so what it must act on besides (the client gone, a close asked
    for) wakes it."""

    def __init__(self, on_set: Callable[[], None]) -> None:
        super().__init__()
        self._on_set = on_set

    def set(self) -> None:
        if not self.is_set():
            super().set()
            self._on_set()


class ClientSocket(abc.ABC):
    """A client WebSocket: ordered sends, one close, and the receive loop with its hooks."""

    def __init__(self, gateway: Gateway, ws: WebSocket) -> None:
        self.gateway = gateway
        self.ws = ws
        self.send_lock = asyncio.Lock()
        self.senders = 0  # sends and closes under way or waiting for ``send_lock``
        # wakes the task relaying this connection's session (that task sets it): see Flag
        self.relay_waker: Callable[[], None] | None = None
        self.gone: asyncio.Event = Flag(self.wake_relay)  # the client left (or we closed it)
        self.closed_sent = False
        # the session itself failed and is telling the client so: an event whose handling fails
        # meanwhile (the same cause, e.g. Redis away) adds no second error before session.closed
        self.failing = False
        self.last_server_error: str | None = None  # the last server error code sent, if any
        self.recording: SessionRecording = OFF  # a subclass opens one (api/recordings)
        self.log_id = "-"  # names the connection in log lines (a session or turn id)
        # dead and stuck clients (api/gateway/client_watch.py)
        self.last_heard = time.monotonic()  # the client's last frame
        self.last_sent = 0.0  # our last frame that the socket took
        self.output_overflowed = False
        self.evict_reason: CloseReason | None = None

    def wake_relay(self) -> None:
        """Make the relay loop look at the session now (``relay_waker``; none: nothing to do)."""
        if self.relay_waker is not None:
            self.relay_waker()

    # ------------------------------------------------------------------ sending
    async def send(self, frame: Frame) -> None:
        """Send one JSON text frame (silently dropped once the client is gone)."""
        if self.gone.is_set():
            return
        data = orjson.dumps(frame).decode()
        self.senders += 1
        try:
            async with self.send_lock:
                if self.ws.application_state != WebSocketState.CONNECTED:
                    return
                try:
                    await self.ws.send_text(data)
                    self.last_sent = time.monotonic()
                    code = telemetry.frame_sent(self.gateway.metrics, frame)
                    self.last_server_error = code or self.last_server_error
                    self.recording.sent(frame)
                except Exception:  # noqa: BLE001 - the peer went away mid-send: it is gone
                    self.gone.set()
        finally:
            self.senders -= 1

    def can_send_now(self) -> bool:
        """Whether ``send`` would finish without waiting: nobody else is sending and the client
        reads what it is sent. (The output bus delivers an event from its own task only then: a
        client that does not keep up must hold up its own session's task, never the bus.)"""
        return self.senders == 0 and not self.gone.is_set() and client_watch.writable(self.ws)

    async def send_error(self, code: ErrorCode, message: str, field: str | None = None) -> None:
        """Send an ``error`` frame of ``/v1/realtime``."""
        await self.send(error_frame(code, message, field))

    async def close(self, code: int = status.WS_1000_NORMAL_CLOSURE, reason: str = "") -> None:
        """Close the socket once."""
        self.senders += 1
        try:
            async with self.send_lock:
                if self.ws.application_state == WebSocketState.CONNECTED:
                    try:
                        await self.ws.close(code=code, reason=reason)
                    except Exception:  # noqa: BLE001 - already closing: nothing left to tell
                        log.debug("close(%d) on a closing socket", code)
        finally:
            self.senders -= 1
        self.gone.set()

    # ------------------------------------------------------------------ lifecycle
    async def serve(self) -> None:
        """Run ``run`` beside the receive loop; close the socket on every exit."""
        receiver = asyncio.create_task(self._receive_loop())
        self.gateway.watch.add(self)
        try:
            await self.run()
        except Exception:
            log.exception("%s failed", type(self).__name__)
            self.failing = True
            await self.on_failure()
        finally:
            try:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
                await self.close()
                await self.gateway.watch.forget(self)  # (after an eviction under way has ended)
            finally:  # also when cancelled: the writer must not keep an open recording
                self.gateway.watch.drop(self)
                self.recording.finish(**self.recording_info())

    @abc.abstractmethod
    async def run(self) -> None:
        """The session's own work (queueing, relaying); the socket closes when it returns."""

    def recording_info(self) -> dict[str, Any]:
        """What the recording's metadata says of this connection besides its media."""
        return {}

    async def on_failure(self) -> None:
        """``run`` raised: tell the client if the protocol has a way (default: close 1011)."""
        await self.close(status.WS_1011_INTERNAL_ERROR)

    # ------------------------------------------------------------------ dead and stuck clients
    def idle_seconds(self) -> float:
        """How long the client has been silent while it owes input (default: it never does)."""
        return 0.0

    def output_overflow(self) -> None:
        """The session's undelivered output passed its caps (called by the output bus)."""
        self.output_overflowed = True
        self.gateway.watch.look_now(self)

    async def on_evict(self, reason: CloseReason) -> None:  # noqa: B027 - a hook: by default, nothing
        """The client stopped keeping up: free its worker at once (default: nothing held)."""

    # ------------------------------------------------------------------ receiving
    @abc.abstractmethod
    def decode(self, text: str | None) -> dict[str, Any] | None:
        """One frame -> an event for ``on_event``, or None to ignore it.

        Raises NotJSON (the socket closes with 1003) or ProtocolError (``on_client_error``).
        """

    @abc.abstractmethod
    async def on_event(self, event: dict[str, Any]) -> None:
        """Handle one client event; ProtocolError goes to ``on_client_error``."""

    async def on_client_error(self, exc: ProtocolError) -> None:
        """A client mistake: answer it, the session goes on."""
        await self.send_error(exc.code, exc.message, exc.field)

    async def on_event_failure(self, event: dict[str, Any]) -> None:  # noqa: B027 - a hook: by default, nothing
        """``on_event`` raised something else (logged already); default: keep going."""

    async def _receive_loop(self) -> None:
        while await self._receive_one():
            pass

    async def _receive_one(self) -> bool:
        """Read and handle one frame; False when the loop must end.

        (A function of its own so that the frame, often ~85 KB of audio twice over, raw and
        parsed, is freed as soon as it is handled, not held until the client's next frame.)
        """
        try:
            msg = await self.ws.receive()
        except Exception:  # noqa: BLE001 - socket trouble: treat as a disconnect
            self.gone.set()
            return False
        self.last_heard = time.monotonic()
        if msg["type"] == "websocket.disconnect":
            self.gone.set()
            return False
        try:
            event = self.decode(msg.get("text"))
        except NotJSON as exc:
            await self.close(status.WS_1003_UNSUPPORTED_DATA, str(exc)[:120])
            return False
        except ProtocolError as exc:
            await self.on_client_error(exc)
            return True
        if event is None:
            return True
        self.recording.client_event(event)
        try:
            await self.on_event(event)
        except ProtocolError as exc:
            await self.on_client_error(exc)
        except Exception:
            log.exception("handling %s failed", event.get("type"))
            if not self.failing:
                await self.on_event_failure(event)
        return True
