"""Whether a lease found gone means its holder stopped renewing it, or Redis stalled.

Leases are keys with a TTL that their holder renews: a worker its sessions' leases and its
presence key, a gateway its own. When Redis itself stops answering for a while (frozen by a long
fork or fsync, a paused VM) the TTLs run on while nobody can renew them, and every lease expires
together: read just after, a gone lease says nothing about its holder. Believed, it would end or
fail over every session of a healthy pool after a stall of a few seconds (the gateway reads its
workers' leases gone) and, past the gateway's TTL, the workers would end their sessions as
abandoned.

So each reader times its own periodic round trip to Redis: one that ends a stall (the last one
failed, this one took ``STALL_S`` longer than usual, or it came ``STALL_S`` later than due)
starts a settling period, and a gone lease is believed only once Redis has answered on time for
``settle_s`` (a lease TTL: time for the holders' next renewals), and only while the reader's
own round trips keep coming on time.

A reader that was itself stalled (its process frozen, its event loop blocked) sees the same long
round trip, though Redis and the leases were fine: a worker's session that ended meanwhile
deleted its lease, and that gone lease is news the gateway must act on at once (it reads the rest
of the session's log then). So a reader that can, gives Redis's own clock with each answer
(``server_s``: ``TIME`` in the gateway's liveness script): Redis stalled when it ran this read
``STALL_S`` later, by its clock, than the reader's clock says it was sent, compared with the read
before (the two clocks' offset cancels out); a first answer, with none before it, is judged by
its round trip alone.

Redis that answers but refuses writes (full: ``maxmemory`` with ``noeviction``; a failed save:
``MISCONF``; a former primary that is a replica now: ``READONLY``) lets the leases lapse the
same way while every read comes on time. A reader that writes too (the gateway renews its own
lease) says so (``writes_refused``); gone leases are then believed only once its writes have
gone through again for ``settle_s``.
"""

from __future__ import annotations

import time

STALL_S = 0.5  # an answer this much later than usual: Redis (or this process) stalled


class StallWatch:
    """Times one periodic round trip to Redis (see the module docstring). Thread-safe enough:
    one thread reports, any thread asks (a float or None is read or written at once)."""

    def __init__(self, every_s: float, settle_s: float) -> None:
        self.every_s = every_s  # how often the round trip is made
        self.settle_s = settle_s
        self._ok_at: float | None = None  # the last answer (monotonic)
        self._sent: tuple[float, float] | None = None  # the last answered (began, server_s)
        self._failed = False
        self._refused = False  # the reader's own writes are refused now
        self._believe_from = 0.0

    def answered(self, began: float, server_s: float | None = None) -> bool:
        """The round trip begun at ``began`` (monotonic) was answered (by Redis at its own
        ``server_s``, if known); True when it ended a stall (the settling period starts now)."""
        now = time.monotonic()
        last = self._ok_at
        if server_s is not None and self._sent is not None:
            sent, self._sent = self._sent, (began, server_s)
            lag = (server_s - sent[1]) - (began - sent[0])  # Redis ran it this much later
            stalled = self._failed or lag > STALL_S
        else:  # (a first answer with Redis's clock has nothing to compare it with)
            self._sent = None if server_s is None else (began, server_s)
            stalled = (
                self._failed
                or now - began > STALL_S
                or (last is not None and began - last > self.every_s + STALL_S)
            )
        if stalled:
            self._believe_from = now + self.settle_s
        self._failed = False
        self._ok_at = now
        return stalled

    def failed(self) -> None:
        """The round trip failed (Redis away): the next answer ends a stall."""
        self._failed = True
        self._ok_at = self._sent = None

    def writes_refused(self) -> None:
        """Redis refused one of the reader's writes (out of memory, read-only): no lease can be
        renewed, so none read gone is believed until ``writes_accepted``."""
        self._refused = True

    def writes_accepted(self) -> None:
        """A write of the reader went through: after refusals, the leases settle from now."""
        if self._refused:
            self._refused = False
            self._believe_from = max(self._believe_from, time.monotonic() + self.settle_s)

    @property
    def refusing(self) -> bool:
        """Whether Redis refuses the reader's writes now (its last one was refused)."""
        return self._refused

    def paused(self) -> None:
        """No round trip for a while on purpose (nothing to read): that gap is no stall."""
        self._ok_at = self._sent = None

    def settled(self) -> bool:
        """Whether a lease read as gone now may be believed."""
        now = time.monotonic()
        last = self._ok_at
        on_time = last is not None and now - last <= self.every_s + STALL_S
        return on_time and now >= self._believe_from and not self._refused
