"""The wait a queued client is told: the time until enough slots free up for its place.

One mean hold time for every session misleads both ways: a chat turn holds its slot seconds, a
duplex session minutes. So each mode has its own mean (a moving average kept by ``RELEASE``),
a running session is expected to hold its slot for its mode's mean less what it ran already
(never past its duration limit), and each ticket ahead takes a slot as one frees and holds it
for its own mode's mean. One pass over the queue with a heap of slot free times gives every
position's wait: cheap enough for every queue update.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

# the mean hold of a mode no session of which has ended yet (whole sessions, dispatch to release)
DEFAULT_HOLD_S = {"chat": 10.0, "audio": 60.0, "video": 60.0}
FALLBACK_HOLD_S = 30.0  # a mode not listed, before any session at all has ended
# a session past its mode's mean is still expected to run this share of the mean, at least
# OVERDUE_MIN_S: it is running, so it has not ended, and the mean says nothing finer
OVERDUE_SHARE = 0.1
OVERDUE_MIN_S = 1.0
HOLD_EMA_ALPHA = 0.2  # the weight of the latest hold in each moving average


@dataclass(frozen=True, slots=True)
class Running:
    """A session on a ready slot: its mode, how long since its slot was dispatched, and the
    time left until its duration limit (``inf``: none known)."""

    mode: str
    elapsed_s: float
    cap_left_s: float = math.inf


@dataclass(frozen=True, slots=True)
class Waiting:
    """A ticket in the queue: its mode and the time left until its duration limit."""

    mode: str = ""
    cap_left_s: float = math.inf


class HoldTimes:
    """The mean slot hold of each mode: measured, else the operator's baseline for the mode
    (``base``: the official admin API's ETA settings), else the default of the mode."""

    def __init__(
        self,
        measured: dict[str, float],
        overall_s: float | None = None,
        base: dict[str, float] | None = None,
    ) -> None:
        self.measured = measured
        self.overall_s = overall_s  # all modes together (a ticket of an unknown mode)
        self.base = base or {}

    def of(self, mode: str) -> float:
        """The mean hold of ``mode``."""
        got = self.measured.get(mode)
        if got is not None:
            return got
        if mode in self.base:
            return self.base[mode]
        if mode in DEFAULT_HOLD_S:
            return DEFAULT_HOLD_S[mode]
        return self.overall_s if self.overall_s is not None else FALLBACK_HOLD_S

    def left(self, session: Running) -> float:
        """The expected time until a running session frees its slot."""
        mean = self.of(session.mode)
        floor = max(OVERDUE_MIN_S, OVERDUE_SHARE * mean)
        return max(0.0, min(max(mean - session.elapsed_s, floor), session.cap_left_s))


class WaitEstimator:
    """The wait of each queue position (1-based), simulated as far as it was asked for.

    ``free_at``: when each slot that will serve the queue frees up, from now (0: idle now).
    ``waiting``: the queue's tickets in order; a position past them is a ticket of no known
    mode.
    """

    def __init__(
        self, free_at: Sequence[float], waiting: Sequence[Waiting], holds: HoldTimes
    ) -> None:
        self._heap = sorted(free_at) or [0.0]
        self._waiting = waiting
        self._holds = holds
        self._waits: list[float] = []

    def wait_s(self, position: int) -> float:
        """Seconds until the ticket at ``position`` gets a slot."""
        while len(self._waits) < max(1, position):
            self._step()
        return self._waits[max(1, position) - 1]

    def _step(self) -> None:
        i = len(self._waits)
        ticket = self._waiting[i] if i < len(self._waiting) else Waiting()
        start = heapq.heappop(self._heap)
        self._waits.append(start)
        # a ticket whose limit runs out while it waits leaves without taking the slot
        hold = min(self._holds.of(ticket.mode), max(0.0, ticket.cap_left_s - start))
        heapq.heappush(self._heap, start + hold)


def slot_free_times(
    running: Sequence[Running], ready: int, loading: int, load_left_s: float, holds: HoldTimes
) -> Iterator[float]:
    """When each slot frees up: the running sessions' expected time left, idle ready slots now,
    and the slots of loading workers once their load is done."""
    for session in running[:ready]:
        yield holds.left(session)
    for _ in range(ready - len(running)):
        yield 0.0
    for _ in range(loading):
        yield load_left_s
