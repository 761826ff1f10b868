"""One chat turn on a worker, shared by ``/v1/realtime`` chat mode and ``/ws/chat``.

The turn runs on the slot the client was admitted to, as a short ``omniserve.chat_turn`` task
with its own output channel (``turn_id``); its events are relayed through ``TaskRelay`` (start
timeout, lease watch, replay catch-up, gaps) until its ``Done`` (or ``TurnEnd``). The request
itself goes to the task through Redis (``streaming/chat_requests.py``), never as a task argument.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from api.gateway.state import Gateway
from api.realtime.slot_wait import Admitted
from api.relay.retry import start_elsewhere
from api.relay.task import TaskNotStarted, TaskRelay
from streaming.chat_requests import chat_request_value, drop_chat_request
from streaming.events import Done, Event, TurnEnd
from streaming.jobs import ChatJob
from streaming.output import SessionOutput

log = logging.getLogger("omniserve.gateway")

POLL_S = 0.5  # how often a quiet turn re-checks ``stopping`` and its worker


class ChatTurn:
    """Submit one turn and yield its events (see ``events``)."""

    def __init__(
        self,
        gateway: Gateway,
        turn_id: str,
        admitted: Admitted,
        request: dict[str, Any],
        deadline_ts: float,
        on_overflow: Callable[[], None] | None = None,
        out: SessionOutput | None = None,
        on_slot: Callable[[str], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.on_overflow = on_overflow  # the turn's undelivered output passed its caps
        self.turn_id = turn_id
        self.slot_id = admitted.slot_id
        self.request = request
        self.deadline_ts = deadline_ts
        self.out = out  # the turn's output channel when opened already (see RealtimeChat)
        self.on_slot = on_slot  # told the slot the turn moved to (its worker died first)

    def _job(self) -> ChatJob:
        return ChatJob(
            turn_id=self.turn_id,
            slot_id=self.slot_id,
            gateway_id=self.gateway.gateway_id,
            deadline_ts=self.deadline_ts,
        )

    def _request(self) -> dict[str, tuple[bytes, int]]:
        """The turn's request, written with its task (``streaming/chat_requests.py``)."""
        s = self.gateway.settings
        return chat_request_value(
            self.gateway.keys, self.turn_id, self.request, s.task_start_timeout_s
        )

    async def events(
        self, stopping: Callable[[], bool], until: Sequence[asyncio.Event] = ()
    ) -> AsyncGenerator[Event, None]:
        """The turn's events in order, up to its ``Done`` (or, when it has none, up to
        ``TurnEnd``, not included).

        The turn ends for the client at ``Done``: all the task sends after it is ``TurnEnd``,
        which the worker writes in a round trip of its own, and a next turn sent at once
        need not wait for it.

        When ``stopping()`` becomes true the worker is told to stop (a turn that has not started
        is abandoned, so it never will) and the iteration ends. A turn whose worker died before
        starting it starts on another slot (``api/relay/retry.py``); one of ``until`` set while
        it waits for that slot ends the wait, and the iteration. Raises TaskNotStarted, or
        WorkerLost after yielding whatever the replay log still held. Use it inside
        ``contextlib.aclosing`` so the output channel is closed however the caller leaves.
        """
        gateway = self.gateway
        out = self.out or await gateway.bus.open(self.turn_id, on_overflow=self.on_overflow)
        relay = TaskRelay(gateway, out, self.turn_id, self.slot_id, "turn")
        try:
            # the request goes with the task, in one transaction (a failure frees the slot)
            await relay.submit(self._job(), self._request())
            while True:
                if stopping():
                    await relay.stop(None)
                    return
                try:
                    events = await relay.next(POLL_S)
                except TaskNotStarted as exc:  # its worker died first: another slot, or not
                    moved = await start_elsewhere(
                        gateway, relay, exc, stopping(), self._request(), until
                    )
                    if moved is None and stopping():  # the client closed meanwhile
                        return
                    if moved is None:
                        raise
                    relay = moved
                    self.slot_id = moved.slot_id
                    if self.on_slot is not None:
                        self.on_slot(moved.slot_id)
                    continue
                for ev in events:
                    if isinstance(ev, TurnEnd):
                        return
                    yield ev
                    if isinstance(ev, Done):
                        return
        finally:
            await gateway.bus.close(self.turn_id)
            if not relay.started:  # a task that started took its request in its claim
                try:
                    await drop_chat_request(gateway.redis, gateway.keys, self.turn_id)
                except Exception:  # Redis away: the request's TTL removes it
                    log.debug("request of turn %s not dropped", self.turn_id, exc_info=True)
