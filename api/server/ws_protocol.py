"""uvicorn's WebSocket protocol, answering an oversized message with an ``error`` event first.

A message larger than ``OMNISERVE_MAX_FRAME_BYTES`` is refused by the WebSocket library itself,
from the frame header, before any of it is buffered: it fails the connection with close 1009
("message too big", RFC 6455 7.4.1), and the application never sees the message. Clients of
this API learn why a session ended from an ``error`` event (spec/01), so this protocol puts one
on the wire just before that close frame: ``invalid_payload`` on ``/v1/realtime``, the string
error of ``/ws/chat`` (spec/05). Nothing else changes; uvicorn runs it in place of its own
``websockets-sansio`` protocol (``omniserve gateway``).
"""

from __future__ import annotations

import orjson
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import CloseCode, Frame, Opcode

from api.metrics import telemetry
from api.protocol.dialects import legacy_error
from api.protocol.errors import error_frame
from streaming.events import ErrorCode

LEGACY_CHAT_PATH = "/ws/chat"


def too_big_message(limit: int) -> str:
    """What the client is told (the limit in MiB when it is a whole number of them)."""
    size = f"{limit // 2**20} MiB" if limit % 2**20 == 0 else f"{limit} bytes"
    return f"message too big: the largest message this server accepts is {size}"


def too_big_frame(path: str, limit: int) -> bytes:
    """The JSON ``error`` event for an oversized message on the endpoint at ``path``."""
    message = too_big_message(limit)
    if path == LEGACY_CHAT_PATH:
        return orjson.dumps(legacy_error(message))
    return orjson.dumps(error_frame(ErrorCode.INVALID_PAYLOAD, message))


class ExplainedCloseProtocol(WebSocketsSansIOProtocol):
    """``WebSocketsSansIOProtocol`` that sends the ``error`` event before a 1009 close."""

    def handle_parser_exception(self) -> None:
        closing = self.conn.close_sent
        if (
            closing is not None
            and closing.code == CloseCode.MESSAGE_TOO_BIG
            and self.handshake_complete
            and not self.close_sent  # the application had not closed the socket itself
            and not self.transport.is_closing()
        ):
            text = too_big_frame(self.scope["path"], self.config.ws_max_size)
            self._count_error(text)
            # the close frame is queued in the connection, not yet written: the event goes first
            frame = Frame(Opcode.TEXT, text)
            self.transport.write(frame.serialize(mask=False, extensions=self.conn.extensions))
        super().handle_parser_exception()

    def _count_error(self, frame: bytes) -> None:
        """Count the event like every other ``error`` sent (``omniserve_errors_total``): the
        application had put itself in the scope (Starlette does) when the connection began."""
        gateway = getattr(getattr(self.scope.get("app"), "state", None), "gateway", None)
        if gateway is not None:
            telemetry.frame_sent(gateway.metrics, orjson.loads(frame))
