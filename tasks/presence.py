"""Whether a duplex session's client is still there, as its worker sees it.

Before ``session.created`` (no resume record) or with resume off, the session lives as long as
the gateway that submitted it. Once the record exists, the session belongs to whichever
connection resumed it last: attached to a live gateway it runs; detached (the client dropped, or
its gateway died) it pauses, gives its slot back after ``resume_slot_hold_s`` and ends after
``resume_grace_s`` (``streaming/resume.py``). A record that vanishes (Redis restarted empty)
leaves the session with the gateway that relayed it at the last check while that gateway lives:
it keeps its client across the restart and writes the record again. One that no check saw yet
goes on while the gateway that submitted it writes it again (within ``gateway_lease_ttl_s``).
One that was detached then, or whose gateway is gone too, ends: nobody can resume it.
"""

from __future__ import annotations

import logging
import time
from enum import StrEnum
from typing import TYPE_CHECKING

from streaming.outage import REDIS_ERRORS
from streaming.resume import WorkerResume

if TYPE_CHECKING:
    from tasks.session import SessionContext

log = logging.getLogger("omniserve.worker")

DETACHED_CHECK_S = 0.5  # after ``Created``, how often the record is looked for until it is seen
RECORD_DUE_S = 0.6  # after ``Created``, by when the gateway has written the record and a check
# (the first comes 0.2 s after it, ``tasks/duplex.py``) has seen it


class Presence(StrEnum):
    ATTACHED = "attached"  # a live gateway relays the session
    DETACHED = "detached"  # the client is away, within the slot hold: input waits
    PARK = "park"  # away longer than the slot hold: give the slot back, stay resumable
    GONE = "gone"  # away longer than the grace (or resume off): end the session


class PresenceWatch:
    """Checks a session's client; see the module docstring."""

    def __init__(
        self, ctx: SessionContext, record: WorkerResume, grace_s: float, slot_hold_s: float
    ) -> None:
        self.ctx = ctx
        self.record = record
        self.grace_s = grace_s
        self.slot_hold_s = slot_hold_s
        self.resumable = False  # a record was seen: check often
        self._created_at: float | None = None  # monotonic: when the session's Created went out
        self._away_since: float | None = None  # when this worker first saw its gateway dead
        # the live gateway relaying the session at the last check (None: detached, or not seen)
        self._relaying: str | None = None
        self._record_lost_at: float | None = None  # monotonic: when the record was found gone

    def created(self) -> None:
        """The session's ``Created`` went out: with resume on, its gateway writes the record
        now, so check often."""
        if self.grace_s > 0:
            self._created_at = time.monotonic()

    def _record_due(self) -> bool:
        """Whether a missing record was lost: one seen before, or one Redis lost before a check
        could see it (an outage began within ``RECORD_DUE_S`` of ``Created``; a session whose
        gateway writes none, ``/ws/duplex``, then ends as it did before the outage grace)."""
        if self.resumable:
            return True
        made, outage = self._created_at, self.ctx.inputs.outage.began_at
        return made is not None and outage is not None and 0 <= outage - made <= RECORD_DUE_S

    def interval(self, default: float) -> float:
        """Seconds until the next check: often until the record has been seen, then
        ``default``, since the gateway tells a detach as it happens (``DetachedControl``); the
        check finds a gateway gone without a word, and a record that changed hands or ended."""
        return DETACHED_CHECK_S if not self.resumable and self._created_at is not None else default

    def check(self) -> Presence:
        """The client's presence now (Redis errors count as attached: nothing is decided)."""
        try:
            return self._check()
        except REDIS_ERRORS:
            log.warning("session %s: presence check failed", self.ctx.session_id)
            return Presence.ATTACHED

    def _check(self) -> Presence:
        rt = self.ctx.runtime
        att = self.record.attachment() if self.grace_s > 0 else None
        if att is None and self._record_due():
            # the record was there and is gone: Redis restarted empty. The gateway that relayed
            # the session last still has its client when its lease is back (it renews it as
            # ever): the session goes on with it; with no live gateway nobody can resume it and
            # its slot must not wait on a client that is not coming back. A record Redis lost
            # before a check saw it: the gateway that submitted the session writes it again
            # within that TTL if its connection still relays it (not if it detached meanwhile)
            relaying = self._relaying if self.resumable else self.ctx.gateway_id
            if relaying is not None:
                lost = self._record_lost_at
                if lost is None:
                    log.warning(
                        "session %s: its resume record is gone; gateway %s relayed it",
                        self.ctx.session_id,
                        relaying,
                    )
                    lost = self._record_lost_at = time.monotonic()
                # the gateway renews its lease on the new server within its own TTL
                waiting = time.monotonic() - lost < rt.settings.gateway_lease_ttl_s
                if waiting or (self.resumable and rt.gateway_alive(relaying)):
                    return Presence.ATTACHED
            log.warning("session %s: its resume record is gone; ending it", self.ctx.session_id)
            return Presence.GONE
        if att is None:
            alive = rt.gateway_alive(self.ctx.gateway_id)
            return Presence.ATTACHED if alive else Presence.GONE
        self._record_lost_at = None
        self._relaying = None  # (set again below while a live gateway relays it)
        self.resumable = True
        if att.ended:
            return Presence.GONE
        now = time.time()
        if att.gateway and rt.gateway_alive(att.gateway):
            self._away_since = None
            self._relaying = att.gateway
            return Presence.ATTACHED
        if att.gateway:  # its gateway died without detaching: the grace starts now
            log.info(
                "session %s: gateway %s gone; waiting for a resume",
                self.ctx.session_id,
                att.gateway,
            )
            self.record.note_gateway_gone(att.gateway)
            since = now
        else:
            since = att.detached_at or self._away_since or now
        self._away_since = since
        away = now - since
        if away > self.grace_s:
            return Presence.GONE
        if away > self.slot_hold_s:
            return Presence.PARK
        return Presence.DETACHED
