"""What every session task shares: claiming, the output publisher, slot release."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from omnicore.audio import pcm_to_b64
from streaming.events import Closed, Error, ErrorCode, Event, Started
from streaming.input import InputReader
from streaming.output import OutputPublisher
from tasks.bootstrap import install_child_sigterm
from tasks.runtime import WorkerRuntime, get_runtime

log = logging.getLogger("omniserve.worker")


def new_id(prefix: str) -> str:
    """A short unique id such as ``resp_3f2a9c1d0b7e``."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@dataclass
class SessionContext:
    """One running session (or chat turn) on this worker."""

    rt: WorkerRuntime
    session_id: str
    slot_id: str
    gateway_id: str
    deadline_ts: float
    out: OutputPublisher
    inputs: InputReader
    silenced: bool = False  # the step watchdog ended this session; nothing more goes out

    def emit(self, event: Event) -> None:
        """Send one event to the gateway."""
        if not self.silenced:
            self.out.emit(event)

    def silence(self) -> None:
        """Drop every later event (the session was already ended for the client)."""
        self.silenced = True

    def error(
        self,
        code: ErrorCode,
        message: str,
        *,
        recoverable: bool = True,
        field: str | None = None,
        input_id: str | None = None,
    ) -> None:
        """Send an error event."""
        self.emit(
            Error(
                code=code,
                message=message,
                recoverable=recoverable,
                field=field,
                input_id=input_id,
            )
        )

    def closed(self, reason: str) -> None:
        """Send the final event of a session (a CloseReason or the client's own reason)."""
        self.emit(Closed(reason=reason))


@contextmanager
def running_session(
    session_id: str, slot_id: str, gateway_id: str, deadline_ts: float
) -> Iterator[SessionContext | None]:
    """Claim the session and hold its slot for the duration of the block.

    Yields None when the session must not run (already claimed: a re-delivered or stale task,
    or a slot that is not this process's); the block then does nothing.
    """
    rt = get_runtime()
    if not rt.owns_slot(slot_id):
        log.warning("task for slot %s reached %s; ignored", slot_id, rt.worker_id)
        yield None
        return
    if not rt.claim(session_id):
        log.warning("session %s already claimed; stale or re-delivered task exits", session_id)
        yield None
        return
    install_child_sigterm()
    s = rt.settings
    out = OutputPublisher(rt.redis, rt.keys, session_id, s.output_log_maxlen, s.session_ttl_s)
    ctx = SessionContext(
        rt=rt,
        session_id=session_id,
        slot_id=slot_id,
        gateway_id=gateway_id,
        deadline_ts=deadline_ts,
        out=out,
        inputs=InputReader(rt.redis, rt.keys, session_id),
    )
    started = time.monotonic()
    rt.begin(slot_id, session_id)
    try:
        ctx.emit(Started(worker_id=rt.worker_id, backend=rt.backend.name if rt.backend else None))
        yield ctx
    finally:
        out.finish()
        rt.end(slot_id, session_id, time.monotonic() - started)


def audio_b64(samples: Any) -> str:
    """Base64 float32 PCM, or the empty string."""
    return pcm_to_b64(samples) if samples is not None and len(samples) else ""
