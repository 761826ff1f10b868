"""The Celery tasks a gateway submits, by name, with their typed arguments.

The gateway never imports worker code: it sends ``job.task`` with ``job.kwargs()`` to the queue
of the worker that owns the slot, and the task functions in ``tasks/`` take exactly these fields
as keyword arguments (tests/unit/streaming/test_jobs.py checks that they match). Arguments are ids
and small settings only, never prompts, media or voices: Flower and anyone else who reads the
broker's task events sees them (tests/e2e/test_security_data.py).
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
    attempt: int = 0  # > 0: a failover restarts the session (init and history from Redis)
    # with attempt > 0: no earlier attempt started (its worker died first), so this one starts
    # the session as the first would have (init from the control stream, ``Started``)
    fresh: bool = False

    @property
    def claim_id(self) -> str:
        """What the worker claims: each attempt of a session runs at most once."""
        return claim_id(self.session_id, self.attempt)

    @property
    def task_id(self) -> str:
        """The Celery task id: the session id (Flower shows sessions by their own id); a
        failover's attempt is ``<session id>.r<n>``, so each attempt is a task of its own."""
        return self.claim_id

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
    attempt: int = 0  # > 0: the turn's earlier attempts never started (their worker died first)

    @property
    def claim_id(self) -> str:
        """What the worker claims: each attempt of a turn runs at most once."""
        return claim_id(self.turn_id, self.attempt)

    @property
    def task_id(self) -> str:
        """The Celery task id: the turn id (``<session id>_t<n>`` for /v1/realtime chat); a
        later attempt's is ``<turn id>.r<n>``."""
        return self.claim_id

    def kwargs(self) -> dict[str, Any]:
        """The task's keyword arguments."""
        return asdict(self)


Job = DuplexJob | ChatJob


def claim_id(session_id: str, attempt: int) -> str:
    """The claim key's id of one attempt of a session (the first is the session id itself)."""
    return session_id if attempt == 0 else f"{session_id}.r{attempt}"
