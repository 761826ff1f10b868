"""One chat turn's worker events, with the watching every turn needs (shared by both chat
endpoints): the task must start in time, and its worker must stay alive."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from api.gateway import Gateway
from streaming.output import SessionOutput


class TurnNotStarted(Exception):
    """No worker started the turn within ``task_start_timeout_s``; its slot was freed."""


class TurnLost(Exception):
    """The worker running the turn disappeared (its lease lapsed)."""


async def turn_events(
    gw: Gateway, out: SessionOutput, turn_id: str, slot: str, stop: Callable[[], bool]
) -> AsyncIterator[dict[str, Any]]:
    """Yield the turn's worker events in order until ``turn_end`` (not yielded).

    When ``stop()`` becomes true the worker is told to stop (a turn that has not started is
    abandoned, so it never will) and the iteration ends. Raises TurnNotStarted, or TurnLost after
    yielding whatever the replay log still held.
    """
    start_by = time.monotonic() + gw.settings.task_start_timeout_s
    started = False
    while True:
        if stop():
            await gw.inputs.control(turn_id, {"type": "close"})
            if not started:
                await gw.abandon(turn_id, slot)
            return
        try:
            events = await out.get(timeout=0.5)
        except TimeoutError:
            events = []
            now = time.monotonic()
            if not started and now > start_by:
                if await gw.abandon(turn_id, slot):
                    raise TurnNotStarted() from None
                start_by = now + gw.settings.task_start_timeout_s  # claimed meanwhile
            elif started and not await gw.session_alive(turn_id):
                await asyncio.sleep(gw.settings.heartbeat_interval_s)
                if not await gw.session_alive(turn_id):
                    events = await out.catch_up()
                    if not any(e.get("type") == "turn_end" for e in events):
                        for ev in events:
                            if ev.get("type") != "started":
                                yield ev
                        raise TurnLost() from None
        for ev in events:
            kind = ev.get("type")
            if kind == "started":
                started = True
            elif kind == "turn_end":
                return
            else:
                yield ev
