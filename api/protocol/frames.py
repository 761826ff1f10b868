"""The server frames of ``/v1/realtime`` and ``/ws/chat`` that are not a worker event's.

Queue positions, session lifecycle, resume and failover: the endpoints call these and send
what they return; a worker's events become frames in ``api/protocol/dialects.py``, the error
frame is ``api/protocol/errors.py``'s. Together they are the only place those frames are built.
"""

from __future__ import annotations

from typing import Any

from api.protocol.errors import Frame
from api.protocol.events import TURN_QUEUE_EVENTS, ServerEvent


def queue_frame(
    event: ServerEvent, position: int, estimated_wait_s: Any, ticket_id: str, queue_length: int
) -> Frame:
    """``session.queued`` or ``session.queue_update``: a waiting client's place in the queue."""
    return {
        "type": event,
        "position": position,
        "estimated_wait_s": estimated_wait_s,
        "ticket_id": ticket_id,
        "queue_length": queue_length,
    }


def queue_done(session_id: str | None = None) -> Frame:
    """``session.queue_done``: a worker slot is the client's (``/ws/chat`` names no session)."""
    if session_id is None:
        return {"type": ServerEvent.SESSION_QUEUE_DONE}
    return {"type": ServerEvent.SESSION_QUEUE_DONE, "session_id": session_id}


def turn_queue_frame(queue_event: Frame, names: Frame) -> Frame:
    """A queue event as a waiting chat turn hears it (``response.queued`` /
    ``response.queue_update``), with the turn's ``names`` (session, response, input ids)."""
    return {**queue_event, "type": TURN_QUEUE_EVENTS[queue_event["type"]], **names}


def turn_queue_done(names: Frame) -> Frame:
    """``response.queue_done``: the waiting chat turn has its slot."""
    return {"type": ServerEvent.RESPONSE_QUEUE_DONE, **names}


def chat_created(session_id: str, recording_id: str | None) -> Frame:
    """``session.created`` of a chat mode session (``turn_based``)."""
    created: Frame = {
        "type": ServerEvent.SESSION_CREATED,
        "session_id": session_id,
        "mode": "turn_based",
        "metrics": {},
    }
    if recording_id:
        created["recording_id"] = recording_id
    return created


def session_closed(session_id: str, reason: str) -> Frame:
    """``session.closed``: the session ended, for ``reason``."""
    return {"type": ServerEvent.SESSION_CLOSED, "session_id": session_id, "reason": reason}


def session_resumed(session_id: str, token: str, last_seq: int) -> Frame:
    """``session.resumed``, the first answer to an accepted ``session.resume``."""
    return {
        "type": ServerEvent.SESSION_RESUMED,
        "session_id": session_id,
        "resume_token": token,
        "last_seq": last_seq,
    }


def resync_frame(session_id: str, first: int, last: int) -> Frame:
    """``session.resync_required``: the log no longer holds client seqs ``first``..``last``."""
    return {
        "type": ServerEvent.SESSION_RESYNC_REQUIRED,
        "session_id": session_id,
        "first_missing_seq": first,
        "last_missing_seq": last,
    }


def session_recovering(session_id: str, reason: str) -> Frame:
    """``session.recovering``: the session's worker was lost, a new one is being found."""
    return {"type": ServerEvent.SESSION_RECOVERING, "session_id": session_id, "reason": reason}


def session_recovered(session_id: str, prompt_length: int, metrics: dict[str, Any]) -> Frame:
    """``session.recovered``: the session goes on, on a new worker."""
    return {
        "type": ServerEvent.SESSION_RECOVERED,
        "session_id": session_id,
        "prompt_length": prompt_length,
        "metrics": metrics,
    }


__all__ = [
    "chat_created",
    "queue_done",
    "queue_frame",
    "resync_frame",
    "session_closed",
    "session_recovered",
    "session_recovering",
    "session_resumed",
    "turn_queue_done",
    "turn_queue_frame",
]
