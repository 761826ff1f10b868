"""The global admission queue, as seen from a gateway (redis-py asyncio)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from streaming import lua
from streaming.codec import loads
from streaming.keys import Keys, slot_worker
from streaming.redis_url import pipe_evalsha, pipe_time
from streaming.wait_estimate import (
    FALLBACK_HOLD_S,
    HoldTimes,
    Running,
    WaitEstimator,
    Waiting,
    slot_free_times,
)

# gets DISPATCH's (ticket, slot) pairs; returns whether the rest of the snapshot is still wanted
OnDispatch = Callable[[list[tuple[str, str]]], bool]


class QueueFull(Exception):
    """The queue is at capacity."""


@dataclass(slots=True)
class Capacity:
    """Worker slots whose worker is alive: serving now, or still loading its backend."""

    ready: int = 0
    loading: int = 0
    load_left_s: float = 0.0  # estimated time until the first loading worker is ready
    notes: list[str] = field(default_factory=list)  # e.g. why `auto` did not pick pocket
    ready_ids: set[str] = field(default_factory=set)  # the workers counted in ``ready``

    @property
    def any(self) -> bool:
        """Some capacity exists or is coming: a client may wait for it."""
        return self.ready + self.loading > 0


@dataclass(slots=True)
class QueueSnapshot:
    """The queue as one read saw it."""

    order: dict[str, int]  # ticket_id -> 1-based position
    length: int
    live_slots: int
    mean_hold_s: float  # all modes together
    loading_slots: int = 0
    load_left_s: float = 0.0
    running: list[Running] = field(default_factory=list)  # the sessions on ready slots
    waiting: list[Waiting] = field(default_factory=list)  # the tickets, in queue order
    mode_hold_s: dict[str, float] = field(default_factory=dict)  # measured mean hold per mode
    base_hold_s: dict[str, float] = field(default_factory=dict)  # set by an operator, per mode
    scores: dict[str, float] = field(default_factory=dict)  # ticket_id -> its arrival order
    _estimator: WaitEstimator | None = field(default=None, repr=False, compare=False)

    def estimated_wait_s(self, position: int) -> int:
        """Whole seconds until the ticket at ``position`` gets a slot (``streaming/wait_estimate``):
        the running sessions' expected time left and the mean hold of each ticket ahead, by mode.

        While no slot is ready yet, the time the loading workers still need comes first.
        """
        if self._estimator is None:
            holds = HoldTimes(self.mode_hold_s, self.mean_hold_s, self.base_hold_s)
            free_at = slot_free_times(
                self.running, self.live_slots, self.loading_slots, self.load_left_s, holds
            )
            self._estimator = WaitEstimator(list(free_at), self.waiting, holds)
        return round(self._estimator.wait_s(position))


class Admission:
    """Enqueue, leave, dispatch and release, each one atomic Lua step over shared state."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, assignment_ttl_s: int = 20) -> None:
        self.redis = redis
        self.keys = keys
        self.assignment_ttl_s = assignment_ttl_s
        self._enqueue = redis.register_script(lua.ENQUEUE)
        self._leave = redis.register_script(lua.LEAVE)
        self._dispatch = redis.register_script(lua.DISPATCH)
        self._enqueue_dispatch = redis.register_script(lua.ENQUEUE_DISPATCH)
        self._release = redis.register_script(lua.RELEASE)

    async def enqueue(
        self,
        ticket_id: str,
        max_queue: int,
        front: bool = False,
        mode: str = "",
        cap_s: float | None = None,
        score: float | None = None,
    ) -> int:
        """Add a ticket at the tail (``front``: ahead of every ordinary ticket, for a failover);
        return its position. Raises QueueFull at capacity (never for ``front``). ``score``: the
        place a lost ticket had (``QueueSnapshot.scores``), kept when it is put back.

        ``mode`` (chat, audio, video) and ``cap_s`` (the time left to the session's duration
        limit; None: none) are what the wait estimates know of the ticket.
        """
        k = self.keys
        pos = await self._enqueue(
            keys=[k.queue, k.queue_seq, k.free_slots, k.queue_events, k.queue_info],
            args=[
                ticket_id,
                max_queue,
                "1" if front else "0",
                "0",
                mode,
                _cap(cap_s),
                "" if score is None else repr(score),
            ],
        )
        if int(pos) < 0:
            raise QueueFull()
        return int(pos)

    async def enqueue_and_dispatch(
        self,
        ticket_id: str,
        max_queue: int,
        front: bool = False,
        mode: str = "",
        cap_s: float | None = None,
    ) -> tuple[int, list[tuple[str, str]]]:
        """``enqueue`` then ``dispatch`` in one atomic step (one round trip): the ticket's
        position and the (ticket, slot) pairs dispatched. Raises QueueFull as ``enqueue``."""
        k = self.keys
        got = await self._enqueue_dispatch(
            keys=[
                k.queue,
                k.queue_seq,
                k.free_slots,
                k.queue_events,
                k.busy_slots,
                k.queue_info,
                k.running_slots,
            ],
            args=[
                ticket_id,
                max_queue,
                "1" if front else "0",
                k.admission,
                self.assignment_ttl_s,
                mode,
                _cap(cap_s),
            ],
        )
        if int(got[0]) < 0:
            raise QueueFull()
        return int(got[0]), _pairs(got[1:])

    async def leave(self, ticket_id: str) -> str | None:
        """Withdraw a ticket. Returns a slot id if one had already been assigned (and frees it)."""
        k = self.keys
        slot = await self._leave(
            keys=[k.queue, k.assignment(ticket_id), k.queue_events, k.queue_info],
            args=[ticket_id],
        )
        if slot:
            slot_id = slot.decode() if isinstance(slot, bytes) else str(slot)
            await self.release(slot_id)
            return slot_id
        return None

    async def dispatch(self, by: str = "") -> list[tuple[str, str]]:
        """Pair waiting tickets with idle slots, oldest first. Returns (ticket, slot) pairs.

        ``by``: the calling gateway, named in the ``dispatch`` event: it takes its own tickets'
        slots from this reply, so it need not claim them when the event comes back.
        """
        flat = await self._dispatch(keys=self._dispatch_keys(), args=self._dispatch_args(by))
        return _pairs(flat)

    def _dispatch_keys(self) -> list[str]:
        k = self.keys
        return [k.queue, k.free_slots, k.busy_slots, k.queue_events, k.queue_info, k.running_slots]

    def _dispatch_args(self, by: str) -> list[str | int]:
        return [self.keys.admission, self.assignment_ttl_s, by]

    async def take_assignment(self, ticket_id: str) -> str | None:
        """Claim the slot dispatched to a ticket (once; LEAVE competes for the same record)."""
        slot = await self.redis.getdel(self.keys.assignment(ticket_id))
        if slot is None:
            return None
        return slot.decode() if isinstance(slot, bytes) else str(slot)

    async def release(self, slot_id: str) -> bool:
        """Give a slot back to the pool (idempotent). No hold time is recorded: a slot the
        gateway gives back served nobody."""
        k = self.keys
        done = await self._release(
            keys=k.release_keys(slot_id),
            args=[slot_id, k.admission],
        )
        return bool(done)

    async def snapshot(self) -> QueueSnapshot:
        """Positions of every waiting ticket, the live slots, what runs on them and the mean
        slot hold times: what the wait estimates need."""
        async with self.redis.pipeline(transaction=False) as pipe:
            self._snapshot_reads(pipe)
            replies = await pipe.execute()
        return await self._snapshot_of(replies)

    async def dispatch_and_snapshot(self, by: str, on_dispatch: OnDispatch) -> QueueSnapshot | None:
        """``dispatch(by)`` and the snapshot's reads in one pipeline (one round trip for both).

        The pairs go to ``on_dispatch`` before the capacity is read, so a slot handed over does
        not wait for the rest of the snapshot; None when ``on_dispatch`` says nobody needs it.
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            # EVALSHA as a plain command: a Script object in a pipeline costs a SCRIPT EXISTS
            # round trip on every execute
            keys = self._dispatch_keys()
            pipe_evalsha(pipe, self._dispatch.sha, keys, self._dispatch_args(by))
            self._snapshot_reads(pipe)
            flat, *replies = await pipe.execute(raise_on_error=False)
        if isinstance(flat, NoScriptError):  # Redis lost its script cache (a restart)
            wanted = on_dispatch(await self.dispatch(by))  # loads the script
            return await self.snapshot() if wanted else None  # read again: the queue moved
        if isinstance(flat, Exception):
            raise flat
        if not on_dispatch(_pairs(flat)):
            return None
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return await self._snapshot_of(replies)

    def _snapshot_reads(self, pipe: Pipeline) -> None:
        k = self.keys
        pipe.zrange(k.queue, 0, -1, withscores=True)
        pipe.hgetall(k.workers)
        pipe.hgetall(k.duration_stats)
        pipe.hgetall(k.queue_info)
        pipe.hgetall(k.running_slots)
        pipe_time(pipe, k.queue)

    async def _snapshot_of(self, replies: list[Any]) -> QueueSnapshot:
        members, workers, stats, info, running, (sec, usec) = replies
        now = int(sec) + int(usec) / 1e6  # Redis's clock: the one the scripts stamp with
        order = {_text(m): i + 1 for i, (m, _) in enumerate(members)}
        scores = {_text(m): float(score) for m, score in members}
        cap = await self.capacity(workers)
        stats = {_text(f): _text(v) for f, v in stats.items()}
        ema = stats.get("ema_s")
        infos = {_text(t): _text(v) for t, v in info.items()}
        return QueueSnapshot(
            order=order,
            length=len(order),
            live_slots=cap.ready,
            mean_hold_s=float(ema) if ema else FALLBACK_HOLD_S,
            loading_slots=cap.loading,
            load_left_s=cap.load_left_s,
            running=_running(running, cap.ready_ids, now),
            waiting=[_waiting(infos.get(t, ""), now) for t in order],
            mode_hold_s=_mode_holds(stats),
            base_hold_s=_mode_holds(stats, "base_s:"),
            scores=scores,
        )

    async def capacity(self, workers: dict[bytes | str, bytes | str] | None = None) -> Capacity:
        """Slots of the live workers, ready or loading (workers whose alive key exists; a
        draining worker is neither)."""
        k = self.keys
        if workers is None:
            workers = await self.redis.hgetall(k.workers)
        cap = Capacity()
        if not workers:
            return cap
        ids = [w.decode() if isinstance(w, bytes) else w for w in workers]
        async with self.redis.pipeline(transaction=False) as pipe:
            for wid in ids:
                pipe.exists(k.worker_alive(wid))
            alive = await pipe.execute()
        lefts = []
        now = time.time()
        for wid, raw, ok in zip(ids, workers.values(), alive, strict=True):
            if not ok:
                continue
            info = loads(raw)
            slots = int(info.get("slots", 1))
            if info.get("note") and info["note"] not in cap.notes:
                cap.notes.append(info["note"])
            state = info.get("state", "ready")
            if state == "draining":  # serves its running sessions, takes no new ones
                continue
            if state == "loading":
                cap.loading += slots
                expected = info.get("expected_load_s") or 30.0
                lefts.append(max(1.0, expected - (now - float(info.get("loading_since", now)))))
            else:
                cap.ready += slots
                cap.ready_ids.add(wid)
        cap.load_left_s = min(lefts) if lefts else 0.0
        return cap

    async def live_slot_count(self, workers: dict[bytes | str, bytes | str] | None = None) -> int:
        """Total slots of the live workers that serve now (backend loaded)."""
        return (await self.capacity(workers)).ready

    async def reap_busy(self) -> int:
        """Forget workers that are gone: their busy slots and their registry entries."""
        k = self.keys
        busy = [_text(s) for s in await self.redis.smembers(k.busy_slots)]
        workers = [_text(w) for w in await self.redis.hkeys(k.workers)]
        owners = sorted({slot_worker(s) for s in busy} | set(workers))
        async with self.redis.pipeline(transaction=False) as pipe:
            for wid in owners:
                pipe.exists(k.worker_alive(wid))
            alive = dict(zip(owners, await pipe.execute(), strict=True))
        dead = [s for s in busy if not alive[slot_worker(s)]]
        gone = [w for w in workers if not alive[w]]
        if dead:
            await self.redis.srem(k.busy_slots, *dead)
            await self.redis.hdel(k.running_slots, *dead)
        if gone:
            await self.redis.hdel(k.workers, *gone)
        return len(dead)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _cap(cap_s: float | None) -> str:
    """A duration limit's time left as the scripts take it ('': none)."""
    return "" if cap_s is None else f"{max(0.0, cap_s):.3f}"


def _left(deadline: str, now: float) -> float:
    """The time from ``now`` to a deadline the scripts wrote (``0``: none)."""
    try:
        at = float(deadline)
    except ValueError:
        return math.inf
    return max(0.0, at - now) if at > 0 else math.inf


def _waiting(info: str, now: float) -> Waiting:
    """A ticket's ``<mode>|<deadline>`` (``queue_info``)."""
    mode, _, deadline = info.partition("|")
    return Waiting(mode, _left(deadline, now))


def _running(raw: dict[Any, Any], ready: set[str], now: float) -> list[Running]:
    """The sessions on ready workers' slots (``running_slots``: ``<mode>|<deadline>|<since>``);
    a draining or dead worker's slots serve the queue no more."""
    out = []
    for slot, value in raw.items():
        if slot_worker(_text(slot)) not in ready:
            continue
        mode, deadline, since = [*_text(value).split("|"), "", ""][:3]
        try:
            elapsed = max(0.0, now - float(since))
        except ValueError:
            elapsed = 0.0
        out.append(Running(mode, elapsed, _left(deadline, now)))
    return out


def _mode_holds(stats: dict[str, str], field: str = "ema_s:") -> dict[str, float]:
    """The measured mean hold of each mode (``ema_s:<mode>`` of ``duration_stats``), or with
    ``field="base_s:"`` the hold an operator set for a mode without a measured one."""
    out = {}
    for name, value in stats.items():
        if name.startswith(field):
            try:
                out[name.removeprefix(field)] = float(value)
            except ValueError:
                continue
    return out


def _pairs(flat: list[bytes | str]) -> list[tuple[str, str]]:
    """{ticket, slot, ticket, slot, ...} as (ticket, slot) pairs."""
    items = [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
    return list(zip(items[0::2], items[1::2], strict=True))
