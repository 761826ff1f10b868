"""The Celery tasks a gateway submits, by name, with their typed arguments.

The gateway never imports worker code: it sends ``job.task`` with ``job.kwargs()`` to the queue
of the worker that owns the slot, and the task functions in ``tasks/`` take exactly these fields
as keyword arguments (tests/test_streaming_jobs.py checks that they match). Arguments are ids
and small settings only, never prompts, media or voices: Flower and anyone else who reads the
broker's task events sees them (tests/test_security_data.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

DUPLEX_TASK = "omniserve.duplex_session"
CHAT_TASK = "omniserve.chat_turn"


@dataclass(frozen=True, slots=True, kw_only=True)
class DuplexJob:
    """One full-duplex session, pinned to ``slot_id`` for its whole life."""

    task: ClassVar[str] = DUPLEX_TASK
    session_id: str
    slot_id: str
    gateway_id: str
    public_mode: str  # video or audio
    deadline_ts: float  # unix time: connect time + the mode's duration limit

    def kwargs(self) -> dict[str, Any]:
        """The task's keyword arguments."""
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatJob:
    """One stateless chat turn. Its request (prompts, media) is not an argument: it waits in
    Redis for the task (``streaming/chat_requests.py``), so the broker never carries it."""

    task: ClassVar[str] = CHAT_TASK
    turn_id: str
    slot_id: str
    gateway_id: str
    deadline_ts: float

    def kwargs(self) -> dict[str, Any]:
        """The task's keyword arguments."""
        return asdict(self)


Job = DuplexJob | ChatJob
