"""The client-facing error: ``ProtocolError`` and the ``error`` frame.

Error codes are ``streaming.events.ErrorCode`` (one definition for workers and gateway); close
codes are starlette's ``status.WS_*`` constants.
"""

from __future__ import annotations

from typing import Any

from streaming.events import ErrorCode

Frame = dict[str, Any]
"""One JSON server event, as sent to a client."""


class ProtocolError(Exception):
    """A client mistake answered with an ``error`` frame; the session goes on."""

    def __init__(self, code: ErrorCode, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


def error_frame(code: ErrorCode, message: str, field: str | None = None) -> Frame:
    """The ``error`` server event of ``/v1/realtime``."""
    err: dict[str, Any] = {
        "code": code.value,
        "message": message,
        "type": "client_error" if code.is_client_error else "server_error",
    }
    if field:
        err["field"] = field
    return {"type": "error", "error": err}
