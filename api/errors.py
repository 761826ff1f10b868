"""Error codes of the public protocol and the error frame."""

from __future__ import annotations

from typing import Any

# client errors: the session stays open
NOT_READY = "not_ready"
UNKNOWN_EVENT = "unknown_event"
MISSING_FIELD = "missing_field"
INVALID_PAYLOAD = "invalid_payload"
UNAUTHORIZED = "unauthorized"
# server errors
SERVICE_UNAVAILABLE = "service_unavailable"  # close 1013
QUEUE_FULL = "queue_full"  # close 1013
WORKER_BUSY = "worker_busy"  # close 1013
WORKER_CONNECT_FAILED = "worker_connect_failed"  # close 1013
INFERENCE_ERROR = "inference_error"  # recoverable
BACKEND_ERROR = "backend_error"
OUTPUT_GAP = "output_gap"

CLIENT_ERRORS = {NOT_READY, UNKNOWN_EVENT, MISSING_FIELD, INVALID_PAYLOAD, UNAUTHORIZED}

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # server shutdown
CLOSE_UNSUPPORTED_DATA = 1003  # a frame that is not JSON
CLOSE_POLICY = 1008  # authentication / bad endpoint parameters
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013


class ProtocolError(Exception):
    """A client mistake answered with an ``error`` frame; the session goes on."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


def error_frame(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """The ``error`` server event."""
    err: dict[str, Any] = {
        "code": code,
        "message": message,
        "type": "client_error" if code in CLIENT_ERRORS else "server_error",
    }
    if field:
        err["field"] = field
    return {"type": "error", "error": err}
