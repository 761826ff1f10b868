"""This gateway's waiting clients: tickets in the global queue, assignments and position updates."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from api.gateway.waiting_events import WaitingEvents, WaitingTask
from api.protocol.events import ServerEvent
from api.protocol.frames import queue_frame
from omnicore.aio import cancel_and_wait
from streaming.admission import Admission, QueueFull, QueueSnapshot

REENQUEUE_LIMIT = 2**31  # a lost ticket goes back whatever the queue length
COALESCE_S = 0.02  # queue events within this pause are handled by one refresh
SLOT_FREED = frozenset({"release", "offer"})  # queue events that may let a waiter in
FULL_REFRESH_S = 1.0  # a refresh (DISPATCH, every waiter looked at) at least this often
LOST_AFTER_S = 2.0  # a ticket missing from the queue, unassigned, this long was lost: re-enqueue


class NoCapacity(Exception):
    """No worker slot became ready while this client waited ``capacity_wait_s``."""


log = logging.getLogger("omniserve.gateway")

Notify = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(eq=False)
class Waiter:
    """One waiting ticket of this gateway."""

    ticket_id: str
    notify: Notify
    future: asyncio.Future[str]
    enqueued_at: float = field(default_factory=time.monotonic)
    last_position: int | None = None
    last_sent: float = 0.0
    missing_since: float | None = None  # when the ticket was first seen missing, unassigned
    assigned_at: float | None = None  # when this gateway took the ticket's slot assignment
    owner: object | None = None  # the connection waiting (what the operator views show of it)
    mode: str = ""  # chat, audio or video: what the wait estimates know of the ticket
    deadline: float | None = None  # unix time: the session's duration limit, if it has one
    score: float | None = None  # its place in the queue as last read (kept if Redis loses it)

    def cap_s(self) -> float | None:
        """The time left until the deadline (None: none)."""
        return None if self.deadline is None else self.deadline - time.time()


class QueueManager:
    """Takes tickets, resolves them when dispatch assigns a slot, pushes position updates."""

    def __init__(
        self,
        admission: Admission,
        gateway_id: str,
        max_queue: int,
        update_interval_s: float,
        capacity_wait_s: float = 0.0,
        events: WaitingEvents | None = None,
    ) -> None:
        self.capacity_wait_s = capacity_wait_s
        self.events = events  # the waiting room's task events, for Flower
        self.admission = admission
        self.gateway_id = gateway_id
        self.max_queue = max_queue
        self.update_interval_s = update_interval_s
        self.waiters: dict[str, Waiter] = {}
        self._counter = itertools.count(1)
        self._wake = asyncio.Event()
        self._lost_until = 0.0  # monotonic: until then a missing ticket is lost (``keys_lost``)
        self._slot_freed = asyncio.Event()  # cuts the coalescing pause short (see _loop)
        self._need_dispatch = False  # a slot was freed (or a ticket re-enqueued) since DISPATCH
        self._full_at = 0.0  # monotonic time of the last refresh
        self._task: asyncio.Task[None] | None = None
        self._claims: set[asyncio.Task[bool]] = set()
        self.updates_sent = 0

    def new_ticket_id(self) -> str:
        return f"ticket_{self.gateway_id}_{next(self._counter)}"

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="queue-manager")

    async def stop(self) -> None:
        """Cancelled again until it ends: Python 3.11's ``wait_for`` swallows a cancel that lands
        as the awaited event fires (a queue event at shutdown), and the loop would wait on."""
        if self._task:
            await cancel_and_wait(self._task)

    def keys_lost(self) -> None:
        """This gateway's lease key was gone when it renewed it: Redis lost its keys (restarted
        empty, or a replica without the last writes promoted) or dropped them with the lapsed
        lease. Every waiting ticket found missing from the queue in the next few refreshes is
        lost, not in a dispatch's hands: it goes back at once, so that the tickets of all
        gateways are back, in their order, before a freed slot is handed out, not after
        ``LOST_AFTER_S``."""
        self._lost_until = time.monotonic() + LOST_AFTER_S
        self._wake.set()

    def on_event(self, message: str) -> None:
        """A queue event arrived on the shared channel (enqueue, leave, release, dispatch...).

        A ``dispatch`` by this gateway is not claimed: its script's reply handed the slots over
        already (``_hand_over``). See ``refresh`` for which events cost a refresh.
        """
        if message.startswith("dispatch "):
            parts = message.split(" ")[1:]
            by = ""
            if len(parts) >= 2 and parts[-2] == "by":
                by, parts = parts[-1], parts[:-2]
            if by != self.gateway_id:
                for ticket in parts[0::2]:
                    if ticket in self.waiters:
                        claim = asyncio.ensure_future(self._claim(ticket))
                        self._claims.add(claim)  # keep a reference until it is done
                        claim.add_done_callback(self._claims.discard)
        elif message in SLOT_FREED:
            self._need_dispatch = True
            if self.waiters:
                self._slot_freed.set()
        self._wake.set()

    async def acquire(
        self,
        notify: Notify,
        queued_event: ServerEvent = ServerEvent.SESSION_QUEUED,
        owner: object | None = None,
        front: bool = False,
        task: WaitingTask | None = None,
        mode: str = "",
        deadline: float | None = None,
    ) -> tuple[str, str, float | None]:
        """Wait in the global FIFO for a worker slot; returns (ticket_id, slot_id, assigned_at).

        ``assigned_at`` (monotonic: when the slot was taken) is set when the client was told it
        is queued, None when it never waited. ``front``: a failover's session goes ahead of every
        ordinary ticket. ``task``: the task the client is admitted for; while it waits, Flower
        shows it as sent (``api/gateway/waiting_events.py``), and revoked if the wait ends without a
        slot. ``mode`` and ``deadline`` (unix time: the session's duration limit) make the wait
        estimates of this ticket and those behind it.

        Sends ``session.queued`` and then ``session.queue_update`` through ``notify`` while
        waiting. Raises QueueFull at capacity. Cancelling the call leaves the queue at once (and
        gives back a slot that was assigned in the meantime).
        """
        ticket = self.new_ticket_id()
        loop = asyncio.get_running_loop()
        waiter = Waiter(
            ticket, notify, loop.create_future(), owner=owner, mode=mode, deadline=deadline
        )
        self.waiters[ticket] = waiter
        try:
            _, pairs = await self.admission.enqueue_and_dispatch(
                ticket, self.max_queue, front, mode, waiter.cap_s()
            )
            self._hand_over(pairs)
            if not waiter.future.done():
                snap = await self.admission.snapshot()
                pos = snap.order.get(ticket)
                waiter.score = snap.scores.get(ticket, waiter.score)
                if pos is not None and not waiter.future.done():
                    if task is not None and self.events is not None:
                        self.events.queued(task)
                    await self._send(waiter, snap, pos, queued_event)
                elif pos is None and not waiter.future.done():
                    # dispatched by another gateway between our enqueue and snapshot
                    await self._claim(ticket)
            slot = await waiter.future
            if task is not None and self.events is not None:
                self.events.admitted(task)
            return ticket, slot, waiter.assigned_at if waiter.last_position is not None else None
        except BaseException:
            self.waiters.pop(ticket, None)
            if task is not None and self.events is not None:
                self.events.left(task)
            # shielded: a second cancel must not cut the hand-back short (a leaked slot)
            await asyncio.shield(self._give_back(waiter))
            raise
        finally:
            self.waiters.pop(ticket, None)

    async def _give_back(self, waiter: Waiter) -> None:
        """A wait that ended without its slot being taken: give the slot back, or leave."""
        fut = waiter.future
        try:
            if fut.done() and not fut.cancelled() and not fut.exception():
                await self.admission.release(fut.result())
            else:
                await self.admission.leave(waiter.ticket_id)
        except Exception:
            log.warning("could not withdraw %s", waiter.ticket_id, exc_info=True)

    async def _claim(self, ticket: str) -> bool:
        waiter = self.waiters.get(ticket)
        if waiter is None or waiter.future.done():
            return True
        slot = await self.admission.take_assignment(ticket)
        if slot is None:
            return False
        if waiter.future.done() or ticket not in self.waiters:
            if not _holds(waiter, slot):  # not handed over by a reply meanwhile: nobody has it
                await self.admission.release(slot)
            return True
        waiter.assigned_at = time.monotonic()
        waiter.future.set_result(slot)
        return True

    async def _recover(self, waiter: Waiter, now: float) -> None:
        """A waiting ticket is neither queued nor assigned: Redis lost it (a restart, a
        failover, or our lease lapsed). Put it back once it has been missing a while, or at
        once after ``keys_lost``, in the place it had: the tickets every gateway puts back keep
        their arrival order (the score ``lua.ENQUEUE`` is given)."""
        if waiter.future.done():
            return
        if now >= self._lost_until:  # (Redis was not seen losing its keys: wait, then look again)
            if waiter.missing_since is None:
                waiter.missing_since = now
                return
            if now - waiter.missing_since < LOST_AFTER_S:
                return
        waiter.missing_since = None
        log.warning("ticket %s was lost from the queue; enqueued again", waiter.ticket_id)
        await self.admission.enqueue(
            waiter.ticket_id,
            REENQUEUE_LIMIT,
            mode=waiter.mode,
            cap_s=waiter.cap_s(),
            score=waiter.score,
        )
        self._need_dispatch = True  # plain ENQUEUE does not dispatch; the next refresh does
        self._wake.set()

    def _give_up(self, pending: list[Waiter], snap: QueueSnapshot, now: float) -> list[Waiter]:
        """Fail the waiters that waited ``capacity_wait_s`` while no slot was ready."""
        if self.capacity_wait_s <= 0 or snap.live_slots > 0:
            return pending
        keep = []
        for w in pending:
            if now - w.enqueued_at > self.capacity_wait_s:
                w.future.set_exception(
                    NoCapacity(f"no worker became ready within {self.capacity_wait_s:.0f} s")
                )
            else:
                keep.append(w)
        return keep

    def _hand_over(self, pairs: list[tuple[str, str]]) -> None:
        """Resolve this gateway's waiters with the slots its own DISPATCH reply paired them with.

        Their assignment records stay (they expire): a waiter cancelled before this ran is no
        longer in ``waiters`` (or its future is done) and is skipped; its LEAVE finds the record
        and gives the slot back. A waiter resolved here gives its slot back by RELEASE if it is
        cancelled afterwards, never by LEAVE, so each slot goes back once.
        """
        now = time.monotonic()
        for ticket, slot in pairs:
            waiter = self.waiters.get(ticket)
            if waiter is not None and not waiter.future.done():
                waiter.assigned_at = now
                waiter.future.set_result(slot)

    async def _send(
        self,
        waiter: Waiter,
        snap: QueueSnapshot,
        position: int,
        event_type: ServerEvent = ServerEvent.SESSION_QUEUE_UPDATE,
    ) -> None:
        waiter.last_position = position
        waiter.last_sent = time.monotonic()
        self.updates_sent += 1
        try:
            await waiter.notify(
                queue_frame(
                    event_type,
                    position,
                    snap.estimated_wait_s(position),
                    waiter.ticket_id,
                    snap.length,
                )
            )
        except Exception:
            log.debug("queue update to %s failed", waiter.ticket_id, exc_info=True)

    async def refresh(self, full: bool = True) -> None:
        """DISPATCH, then push positions that changed (and all of them every interval).

        Skipped (no command at all) unless ``full`` (the periodic pass), a slot was freed while
        someone waits here, or a waiter here was already told its position (a waiter still in
        ``acquire`` reads the queue itself): so a chat turn served at once costs no refresh on
        its own events. The DISPATCH and the queue read go in one pipeline.
        """
        pending = [w for w in self.waiters.values() if not w.future.done()]
        told = any(w.last_position is not None for w in pending)
        if not (full or told or (self._need_dispatch and pending)):
            return
        self._need_dispatch = False
        try:
            await self._refresh(pending)
        except BaseException:
            self._need_dispatch = True  # try again next time
            raise
        finally:
            self._full_at = time.monotonic()  # the periodic pass counts from the end of this one

    async def _refresh(self, pending: list[Waiter]) -> None:
        if not pending:
            self._hand_over(await self.admission.dispatch(self.gateway_id))
            return

        def hand_over(pairs: list[tuple[str, str]]) -> bool:
            self._hand_over(pairs)
            return any(not w.future.done() for w in pending)

        snap = await self.admission.dispatch_and_snapshot(self.gateway_id, hand_over)
        if snap is None:
            return  # every waiter looked at was handed its slot
        now = time.monotonic()
        pending = [w for w in pending if not w.future.done()]  # minus those just handed over
        sends = []
        for w in self._give_up(pending, snap, now):
            pos = snap.order.get(w.ticket_id)
            if pos is None:
                # gone from the queue: assigned (claim it), or lost (put it back)
                if not await self._claim(w.ticket_id):
                    await self._recover(w, now)
                continue
            w.missing_since = None
            w.score = snap.scores.get(w.ticket_id, w.score)
            if w.last_position is None:
                continue  # acquire() has not sent session.queued yet; it comes first
            if pos != w.last_position or now - w.last_sent >= self.update_interval_s:
                sends.append(self._send(w, snap, pos))
        if sends:
            await asyncio.gather(*sends)

    async def _loop(self) -> None:
        while True:
            wait = self._full_at + FULL_REFRESH_S - time.monotonic()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, wait))
            except TimeoutError:
                pass
            self._wake.clear()
            self._slot_freed.clear()
            try:
                await self.refresh(time.monotonic() - self._full_at >= FULL_REFRESH_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("queue refresh failed", exc_info=True)
            # coalesce bursts of events, but a slot freed since this refresh began goes to the
            # next client at once, not after the rest of the pause
            try:
                await asyncio.wait_for(self._slot_freed.wait(), COALESCE_S)
            except TimeoutError:
                pass


def _holds(waiter: Waiter, slot: str) -> bool:
    """Whether the waiter was resolved with this very slot."""
    fut = waiter.future
    return fut.done() and not fut.cancelled() and fut.exception() is None and fut.result() == slot


__all__ = ["NoCapacity", "QueueFull", "QueueManager", "Waiter"]
