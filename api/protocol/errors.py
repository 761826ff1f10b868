"""The client-facing error: ``ProtocolError`` and the ``error`` frame.

Error codes and close reasons are ``streaming.events.ErrorCode`` and ``CloseReason`` (one
definition for workers and gateway), re-exported here for the api; close codes are starlette's
``status.WS_*`` constants.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from api.protocol.events import ServerEvent
from streaming.events import CloseReason, ErrorCode

Frame = dict[str, Any]
"""One JSON server event, as sent to a client."""


CLOSING_ERRORS = frozenset(
    {
        ErrorCode.UNAUTHORIZED,
        ErrorCode.QUOTA_EXCEEDED,
        ErrorCode.ORIGIN_NOT_ALLOWED,
        ErrorCode.TOO_MANY_CONNECTIONS,
        ErrorCode.SERVICE_UNAVAILABLE,
        ErrorCode.QUEUE_FULL,
        ErrorCode.WORKER_BUSY,
        ErrorCode.WORKER_CONNECT_FAILED,
        ErrorCode.BACKEND_ERROR,
    }
)
"""The errors that end a session: the server closes the connection after them (docs/PROTOCOL.md,
"Error codes"; a ``backend_error`` comes with ``session.closed``)."""
RESUME_ERRORS = frozenset({ErrorCode.SESSION_NOT_FOUND, ErrorCode.RESUME_EXPIRED})
"""The answers to a ``session.resume`` that failed; the connection closes after them too."""


class ErrorType(StrEnum):
    """An ``error`` frame's ``error.type``: whose mistake it was."""

    CLIENT_ERROR = "client_error"
    SERVER_ERROR = "server_error"


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
        "type": ErrorType.CLIENT_ERROR if code.is_client_error else ErrorType.SERVER_ERROR,
    }
    if field:
        err["field"] = field
    return {"type": ServerEvent.ERROR, "error": err}


__all__ = [
    "CLOSING_ERRORS",
    "RESUME_ERRORS",
    "CloseReason",
    "ErrorCode",
    "ErrorType",
    "Frame",
    "ProtocolError",
    "error_frame",
]
