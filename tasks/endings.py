"""The last events of a session or chat turn that its worker could not finish.

Used when a backend step hangs (the step watchdog) and when a pool process dies (the Celery
parent's supervisor): the client is told at once, in the terms the protocol gives each kind of
work, instead of waiting for a lease to lapse.
"""

from __future__ import annotations

from streaming.events import Closed, CloseReason, Error, ErrorCode, Event, TurnEnd
from streaming.jobs import CHAT_TASK, DUPLEX_TASK

DUPLEX = "duplex"
CHAT = "chat"

KIND_OF_TASK = {DUPLEX_TASK: DUPLEX, CHAT_TASK: CHAT}


def final_events(kind: str, message: str) -> list[Event]:
    """Duplex: ``error backend_error`` + ``closed backend_error``. Chat turn: ``error
    inference_error`` + ``turn_end`` (a chat connection goes on with its next turn)."""
    if kind == CHAT:
        return [Error(code=ErrorCode.INFERENCE_ERROR, message=message), TurnEnd()]
    return [
        Error(code=ErrorCode.BACKEND_ERROR, message=message, recoverable=False),
        Closed(reason=CloseReason.BACKEND_ERROR),
    ]
