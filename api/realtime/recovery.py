"""Resume and failover of a duplex session, the gateway's part (docs/PROTOCOL.md, "Resume and
failover").

- ``parse_resume``: the client's ``session.resume`` event, checked.
- ``Failover.start``: the session's worker is gone (or its slot was given back while the client
  was away): a ``Recovering`` event goes into the session's own sequence, the input streams are
  cleared, the session waits at the head of the queue up to ``failover_wait_s``, and a new
  attempt of the task starts on the slot it gets; that worker prepares the backend with the same
  init and the conversation so far and answers ``Created(recovered=True)``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from api.gateway.state import Gateway
from api.protocol.errors import ProtocolError
from api.relay.retry import front_slot, next_attempt
from api.relay.task import TaskNotStarted, TaskRelay
from streaming.events import ErrorCode, Recovering
from streaming.jobs import DuplexJob
from streaming.output import SessionOutput
from streaming.takeover import append_output

log = logging.getLogger("omniserve.gateway")


@dataclass(frozen=True, slots=True)
class ResumeRequest:
    """A checked ``session.resume``."""

    session_id: str
    resume_token: str
    last_seq: int


def parse_resume(event: dict[str, Any]) -> ResumeRequest:
    """The fields of a ``session.resume``; ProtocolError names the first one missing or wrong."""
    for name in ("session_id", "resume_token"):
        if name not in event:
            raise ProtocolError(ErrorCode.MISSING_FIELD, f"missing required field {name}", name)
        if not isinstance(event[name], str) or not event[name]:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{name} must be a string", name)
    last = event.get("last_seq", 0)
    if not isinstance(last, int) or isinstance(last, bool) or last < 0:
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD, "last_seq must be an integer >= 0", "last_seq"
        )
    return ResumeRequest(event["session_id"], event["resume_token"], last)


class Failover:
    """Restarts one session on a new worker; one instance per session, counting attempts."""

    def __init__(
        self, gateway: Gateway, session_id: str, public_mode: str, deadline: float
    ) -> None:
        self.gateway = gateway
        self.session_id = session_id
        self.public_mode = public_mode
        self.deadline = deadline
        self.attempt = 0

    async def announce(self, out: SessionOutput, reason: str) -> Recovering:
        """Put ``Recovering`` into the session's sequence; returns it (the caller relays it, and
        the reader skips the copy the channel brings back)."""
        gateway = self.gateway
        ev = Recovering(reason=reason)
        seq = await append_output(
            gateway.redis, gateway.keys, self.session_id, ev, gateway.settings.output_log_maxlen
        )
        out.expected = max(out.expected, seq + 1)
        return ev

    async def start(
        self, out: SessionOutput, until: Sequence[asyncio.Event] = ()
    ) -> TaskRelay | None:
        """Find a slot and submit the next attempt; None when none came in time (or one of
        ``until`` was set while it waited: see ``front_slot``)."""
        gateway = self.gateway
        await gateway.inputs.discard(self.session_id)
        slot = await front_slot(gateway, self.session_id, self.deadline, until, self.public_mode)
        if slot is None:
            return None
        self.attempt = await next_attempt(gateway, self.session_id, self.deadline)
        job = DuplexJob(
            session_id=self.session_id,
            slot_id=slot,
            gateway_id=gateway.gateway_id,
            public_mode=self.public_mode,
            deadline_ts=self.deadline,
            attempt=self.attempt,
        )
        relay = TaskRelay(gateway, out, self.session_id, slot, "session", claim_id=job.claim_id)
        try:
            await relay.submit(job)
        except TaskNotStarted as exc:
            log.warning("session %s: failover submit failed: %s", self.session_id, exc.detail)
            return None
        log.info("session %s: attempt %d on slot %s", self.session_id, self.attempt, slot)
        return relay
