"""The opt-in notice that a duplex session is about to end (``session.expiring``).

Two things end a call that nobody closes: its duration limit (``deadline_ts``, from connect),
and, with rollover off, its context window. A client that named ``session.expiring`` in its
init's ``extensions`` hears each once, ``expiring_notice_s`` before it: the duration exactly
(the worker looks at least every poll interval), the context by the rate at which the cache
has grown per second of input so far.
"""

from __future__ import annotations

from streaming.events import Expiring, ExpiringReason


class ExpiryNotice:
    """Decides when one session's notices are due; each reason is told once."""

    def __init__(self, lead_s: float, deadline_ts: float, context_limit: int | None) -> None:
        self.lead_s = lead_s
        self.deadline_ts = deadline_ts
        self.context_limit = context_limit  # None: the context never ends it (rollover on)
        self.told: set[ExpiringReason] = set()
        self._start_kv: int | None = None
        self._audio_s = 0.0

    def duration(self, now: float) -> Expiring | None:
        """The duration notice, when it is due at unix time ``now``."""
        left = self.deadline_ts - now
        if ExpiringReason.DURATION in self.told or left > self.lead_s:
            return None
        self.told.add(ExpiringReason.DURATION)
        return Expiring(reason=ExpiringReason.DURATION, time_left_ms=max(0, round(left * 1000)))

    def started(self, kv: int) -> None:
        """The model session starts with ``kv`` tokens (its prompt)."""
        self._start_kv = kv
        self._audio_s = 0.0

    def context(self, kv: int, audio_s: float) -> Expiring | None:
        """After a step of ``audio_s`` seconds of input that left ``kv`` tokens: the context
        notice, when the cache is estimated full within the lead."""
        self._audio_s += audio_s
        if self.context_limit is None or ExpiringReason.CONTEXT in self.told:
            return None
        if self._start_kv is None:
            self._start_kv = 0
        grown = kv - self._start_kv
        if grown <= 0 or self._audio_s <= 0:
            return None
        left_s = max(0.0, self.context_limit - kv) * self._audio_s / grown
        if left_s > self.lead_s:
            return None
        self.told.add(ExpiringReason.CONTEXT)
        return Expiring(reason=ExpiringReason.CONTEXT, time_left_ms=round(left_s * 1000))
