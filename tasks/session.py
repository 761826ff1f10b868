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
from omnicore.logs import SESSION_ID
from streaming.events import Closed, CloseReason, Done, Error, ErrorCode, Event, Started
from streaming.input import InputReader
from streaming.output_publisher import UNBOUNDED_BYTES, OutputPublisher
from streaming.takeover import last_seq
from tasks.bootstrap import install_child_sigterm
from tasks.endings import CHAT, DUPLEX
from tasks.runtime import WorkerRuntime, get_runtime

log = logging.getLogger("omniserve.worker")


def new_id(prefix: str) -> str:
    """A short unique id such as ``resp_3f2a9c1d0b7e``."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@dataclass
class SessionContext:
    """One running session (or chat turn) on this worker."""

    runtime: WorkerRuntime
    session_id: str
    slot_id: str
    gateway_id: str
    deadline_ts: float
    out: OutputPublisher
    inputs: InputReader
    kind: str = DUPLEX  # duplex or chat (tasks/endings.py)
    silenced: bool = False  # the step watchdog ended this session; nothing more goes out
    close_reason: str | None = None  # the reason of the Closed event sent, if any
    last_error: Error | None = None  # the last error event sent, if any
    done: bool = False  # a chat turn's Done was sent
    parked: bool = False  # the client went away: the slot was given back, a resume may restart
    taken: bool = False  # the session runs on another slot now: this attempt ended silently
    log_linger_s: float = 60.0  # how long the replay log outlives the task (longer when parked)
    request: dict[str, Any] | None = None  # a chat turn's request, read by its claim

    def emit(self, event: Event) -> None:
        """Send one event to the gateway (and note what the outcome depends on)."""
        if self.silenced:
            return
        match event:
            case Closed(reason=reason):
                self.close_reason = reason
            case Error():
                self.last_error = event
            case Done():
                self.done = True
            case _:
                pass
        self.out.emit(event)

    def outcome(self) -> tuple[str, str | None]:
        """How the session or turn ended: an outcome label, and for a failed or abandoned one
        the reason (the task then ends as a Celery FAILURE with it). A request the worker
        refused as invalid is ``rejected`` but not a failure: the service did its job."""
        reason = self.close_reason
        err = self.last_error
        said = f"{err.code.value}: {err.message}" if err is not None else None
        if self.taken:
            return "taken", "the session runs on another slot now (this worker was taken for lost)"
        if self.silenced:
            return "step_timeout", said or "the backend did not answer in time"
        if self.parked:  # this attempt is over; a resume would run the session as a new task
            return "parked", "client_closed: the client went away; slot given back, resumable"
        if reason in (CloseReason.BACKEND_ERROR, CloseReason.ERROR):
            return "failed", said or str(reason)
        if reason == CloseReason.CLIENT_CLOSED:
            return "abandoned", "client_closed: the client or its gateway went away"
        if reason == CloseReason.SERVER_SHUTDOWN:
            return "shutdown", None
        if self.kind == CHAT and not self.done and reason is None:
            if err is not None and err.code.is_client_error:
                return "rejected", None
            return "failed", said or "the turn ended without a result"
        return "completed", None

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


class SessionFailed(Exception):
    """Raised by a session task that failed or was abandoned, after its cleanup, so that Celery
    (and Flower) record it as FAILURE with the reason (the tasks declare it in ``throws``: an
    expected failure, logged without a traceback)."""


@contextmanager
def running_session(
    session_id: str,
    slot_id: str,
    gateway_id: str,
    deadline_ts: float,
    claim_id: str | None = None,
    recover: bool = False,
    kind: str = DUPLEX,
) -> Iterator[SessionContext | None]:
    """Claim the session and hold its slot for the duration of the block (one Redis step:
    streaming/session_claim.py; a chat turn's request is read in it, ``ctx.request``).

    Yields None when the session must not run (already claimed: a re-delivered or stale task,
    or a slot that is not this process's); the block then does nothing. ``claim_id``: what is
    claimed (a failover's attempt has its own). ``recover``: a failover continues the session's
    output sequence and sends no ``Started`` (its ``Created`` tells the gateway instead), so the
    client's sequence numbers stay consecutive. Afterwards the outcome is counted and logged,
    and a failed or abandoned session raises ``SessionFailed``.
    """
    rt = get_runtime()
    if not rt.owns_slot(slot_id):
        log.warning("task for slot %s reached %s; ignored", slot_id, rt.worker_id)
        yield None
        return
    claimed = rt.claim(claim_id or session_id, slot_id, session_id, chat_turn=kind == CHAT)
    if claimed is None:
        log.warning("session %s already claimed; stale or re-delivered task exits", session_id)
        yield None
        return
    install_child_sigterm()
    s = rt.settings
    start = last_seq(rt.redis, rt.keys, session_id) if recover else 0
    out = OutputPublisher(
        rt.redis,
        rt.keys,
        session_id,
        s.output_log_maxlen,
        s.session_ttl_s,
        start_seq=start,
        writer=rt.writer(slot_id),
        outage_grace_s=s.redis_outage_grace_s,
        # a duplex session's log holds its last seconds (a resume, a missed event); a chat
        # turn's, the whole turn (its events are few, and a lost worker's tail is read back)
        log_max_bytes=s.output_log_max_bytes if kind == DUPLEX else UNBOUNDED_BYTES,
        log_max_s=s.output_log_max_s if kind == DUPLEX else float("inf"),
        write=s.output_write,
    )
    ctx = SessionContext(
        runtime=rt,
        session_id=session_id,
        slot_id=slot_id,
        gateway_id=gateway_id,
        deadline_ts=deadline_ts,
        out=out,
        inputs=InputReader(rt.redis, rt.keys, session_id, s.redis_outage_grace_s),
        kind=kind,
        request=claimed.request,
    )
    started = time.monotonic()
    rt.begin(slot_id, session_id)
    logged = SESSION_ID.set(session_id)  # every log line of this task names the session
    try:
        if not recover:
            ctx.emit(
                Started(worker_id=rt.worker_id, backend=rt.backend.name if rt.backend else None)
            )
        yield ctx
    finally:
        out.finish(ctx.log_linger_s)
        held = time.monotonic() - started
        rt.end(slot_id, session_id, held)
        outcome, why = ctx.outcome()
        rt.metrics.count("omniserve_worker_sessions_total", kind, outcome)
        log.info(
            "%s %s on %s ended: outcome=%s reason=%s held_s=%.3f",
            kind,
            session_id,
            slot_id,
            outcome,
            why or ctx.close_reason or "-",
            held,
        )
        SESSION_ID.reset(logged)
    if why is not None:
        raise SessionFailed(why)


def audio_b64(samples: Any) -> str:
    """Base64 float32 PCM, or the empty string."""
    return pcm_to_b64(samples) if samples is not None and len(samples) else ""
