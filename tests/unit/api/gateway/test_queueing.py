"""api/gateway/queueing.py against a real Redis: slots handed over from the scripts' replies, the
round trips that costs, and that no slot leaks whichever way a wait ends.

The QueueManager, Admission and OutputBus are the gateway's own classes, run in this process;
``FULL_REFRESH_S`` is raised so that only queue events drive them (no periodic safety net).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from api.gateway import queueing
from api.gateway.queueing import QueueManager
from streaming import lua
from streaming.admission import Admission
from streaming.keys import Keys
from streaming.output import OutputBus
from streaming.slots import WorkerRegistry

SHA = {name: hashlib.sha1(getattr(lua, name).encode()).hexdigest() for name in ("DISPATCH",)}


async def _quiet(_frame: dict[str, Any]) -> None:
    pass


@asynccontextmanager
async def gateway(r: aioredis.Redis, keys: Keys, gw: str) -> AsyncIterator[QueueManager]:
    """One gateway's queue manager, fed by its own queue-event subscription."""
    await r.set(keys.gateway_alive(gw), b"1", ex=60)
    qm = QueueManager(Admission(r, keys), gw, max_queue=100, update_interval_s=30)
    bus = OutputBus(r, keys, on_queue_event=qm.on_event)
    await bus.start()
    await qm.start()
    await asyncio.sleep(0.1)  # the first (full) refresh is done
    try:
        yield qm
    finally:
        await qm.stop()
        await bus.stop()


def worker(sync_redis: redis.Redis, keys: Keys, slots: int) -> list[str]:
    reg = WorkerRegistry(sync_redis, keys, "w#1", lease_ttl_s=60)
    reg.register({"slots": slots})
    ids = reg.slot_ids(slots)
    reg.heartbeat(ids, {})
    return ids


@contextmanager
def monitor(url: str, prefix: str) -> Iterator[list[str]]:
    """The commands clients sent that name this test's keys (not those run inside scripts)."""
    seen: list[str] = []
    ready, stop = threading.Event(), threading.Event()

    def run() -> None:
        with redis.Redis.from_url(url).monitor() as m:
            ready.set()
            for cmd in m.listen():
                if stop.is_set():
                    return
                if cmd.get("client_type") != "lua" and prefix in cmd["command"]:
                    seen.append(cmd["command"])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(5)
    try:
        yield seen
    finally:
        stop.set()
        redis.Redis.from_url(url).echo("end")  # wakes the reader
        thread.join(5)


async def warm_up(qm: QueueManager) -> None:
    """One served ticket, so the scripts are loaded (a first EVALSHA fails, then loads)."""
    _t, slot, _a = await qm.acquire(_quiet)
    await qm.admission.release(slot)
    await qm.admission.dispatch()
    await asyncio.sleep(0.1)


def count(commands: list[str], word: str) -> int:
    return sum(1 for c in commands if word in c)


@pytest.fixture(autouse=True)
def events_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queueing, "FULL_REFRESH_S", 3600.0)


def assert_all_free(sync_redis: redis.Redis, keys: Keys, slots: list[str]) -> None:
    assert not sync_redis.smembers(keys.busy_slots)
    assert sorted(sync_redis.lrange(keys.free_slots, 0, -1)) == sorted(s.encode() for s in slots)
    assert not list(sync_redis.scan_iter(keys.slot_hold("*")))


async def test_a_ticket_served_at_once_costs_one_round_trip(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys, redis_server: str
) -> None:
    """ENQUEUE_DISPATCH hands the slot over in its reply: no claim, no refresh DISPATCH or
    snapshot on its events, none on the release when nobody waits."""
    slots = worker(sync_redis, keys, 1)
    async with gateway(async_redis, keys, "gwa") as qm:
        await warm_up(qm)
        with monitor(redis_server, keys.prefix) as seen:
            _ticket, slot, assigned_at = await qm.acquire(_quiet)
            await asyncio.sleep(0.2)  # its queue events come back
            await qm.admission.release(slot)  # the worker, at the end of the turn
            await asyncio.sleep(0.2)
        assert slot == slots[0] and assigned_at is None
        assert count(seen, "EVALSHA") == 2, seen  # ENQUEUE_DISPATCH, RELEASE
        assert count(seen, "GETDEL") == 0 and count(seen, SHA["DISPATCH"]) == 0, seen
        assert count(seen, "ZRANGE") == 0, seen
        assert_all_free(sync_redis, keys, slots)


async def test_a_handoff_takes_one_pipeline_from_release_to_slot(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys, redis_server: str
) -> None:
    """The freed slot reaches the waiter through the refresh's DISPATCH reply (pipelined with the
    queue read); nothing after it when nobody else waits."""
    slots = worker(sync_redis, keys, 1)
    async with gateway(async_redis, keys, "gwa") as qm:
        await warm_up(qm)
        _t, held, _a = await qm.acquire(_quiet)
        waiting = asyncio.ensure_future(qm.acquire(_quiet))
        await asyncio.sleep(0.2)  # queued and told so
        assert not waiting.done()
        with monitor(redis_server, keys.prefix) as seen:
            await qm.admission.release(held)
            _ticket, slot, assigned_at = await asyncio.wait_for(waiting, 2)
            await asyncio.sleep(0.2)
        assert slot == held and assigned_at is not None
        assert count(seen, SHA["DISPATCH"]) == 1 and count(seen, "GETDEL") == 0, seen
        assert count(seen, "EXISTS") == 0, seen  # no capacity read: nobody left to tell
        await qm.admission.release(slot)
        await asyncio.sleep(0.1)
        assert_all_free(sync_redis, keys, slots)


async def test_an_acquire_cancelled_while_its_reply_travels_gives_the_slot_back(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    """The script handed a slot out, the client left before the reply was read: LEAVE finds the
    assignment record and the slot goes back."""
    slots = worker(sync_redis, keys, 1)
    async with gateway(async_redis, keys, "gwa") as qm:
        real = qm.admission.enqueue_and_dispatch
        task: asyncio.Task[Any] | None = None

        async def lost_reply(*args: Any, **kwargs: Any) -> Any:
            await real(*args, **kwargs)
            assert task is not None
            task.cancel()  # the client left while the reply was on its way
            await asyncio.sleep(5)  # the cancel lands here, as on the reply's read
            raise AssertionError("not cancelled")

        qm.admission.enqueue_and_dispatch = lost_reply  # type: ignore[method-assign]
        task = asyncio.ensure_future(qm.acquire(_quiet))
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)
        assert_all_free(sync_redis, keys, slots)
        assert not list(sync_redis.scan_iter(keys.assignment("*")))


async def test_acquires_cancelled_at_any_moment_leak_no_slot(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    """Cancelled before, during and after the hand-over (then given back as ``_withdraw`` does),
    with a waiter queued behind: every slot is free at the end."""
    slots = worker(sync_redis, keys, 2)
    async with gateway(async_redis, keys, "gwa") as qm:
        for i in range(40):
            first = asyncio.ensure_future(qm.acquire(_quiet))
            second = asyncio.ensure_future(qm.acquire(_quiet))
            await asyncio.sleep(i * 0.00025)
            for task in (first, second):
                task.cancel()
            for task in (first, second):
                try:
                    _ticket, slot, _at = await task
                except asyncio.CancelledError:
                    continue
                await qm.admission.release(slot)
        await asyncio.sleep(0.3)
        assert_all_free(sync_redis, keys, slots)


async def test_a_claim_racing_the_hand_over_keeps_the_slot(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    """A claim whose GETDEL was in flight when the reply handed the same slot over must not give
    that slot back (it is the client's now)."""
    worker(sync_redis, keys, 1)
    async with gateway(async_redis, keys, "gwa") as qm:
        adm = qm.admission
        real_take = adm.take_assignment
        pairs = None

        async def racing_take(ticket: str) -> str | None:
            slot = await real_take(ticket)
            assert pairs is not None
            qm._hand_over(pairs)  # the reply got there first
            return slot

        real_enqueue = adm.enqueue_and_dispatch

        async def enqueue_then_claim(*args: Any, **kwargs: Any) -> Any:
            nonlocal pairs
            pos, pairs = await real_enqueue(*args, **kwargs)
            adm.take_assignment = racing_take  # type: ignore[method-assign,assignment]
            assert await qm._claim(pairs[0][0])  # the event's claim, ahead of the reply
            return pos, pairs

        adm.enqueue_and_dispatch = enqueue_then_claim  # type: ignore[method-assign]
        _ticket, slot, _at = await qm.acquire(_quiet)
        assert sync_redis.sismember(keys.busy_slots, slot)
        assert sync_redis.llen(keys.free_slots) == 0


async def four_waiting(a: QueueManager, b: QueueManager) -> tuple[str, list[asyncio.Future[Any]]]:
    """``a`` takes the one slot; then four clients wait, arriving at b, a, b, a in that order.
    Returns the slot and their waits."""
    _t, slot, _at = await a.acquire(_quiet)
    waits: list[asyncio.Future[Any]] = []
    for qm in (b, a, b, a):
        waits.append(asyncio.ensure_future(qm.acquire(_quiet)))
        await asyncio.sleep(0.05)  # arrival order
    return slot, waits


async def served_order(qm: QueueManager, slot: str, waits: list[asyncio.Future[Any]]) -> list[int]:
    """Free ``slot`` once per wait, each time to exactly one of them; the order they were served
    in (indexes of ``waits``). The last slot is given back."""
    order = []
    waits = list(waits)
    for _ in range(len(waits)):
        await qm.admission.release(slot)
        done, _ = await asyncio.wait(waits, timeout=2, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "a freed slot went to nobody (or to two)"
        task = done.pop()
        order.append(waits.index(task))
        waits[waits.index(task)] = asyncio.ensure_future(asyncio.sleep(3600))
        _t, slot, _at = task.result()
    for w in waits:
        w.cancel()
    await qm.admission.release(slot)
    return order


async def test_two_gateways_serve_one_queue_in_order_on_events_alone(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    """Whichever gateway's DISPATCH pairs a ticket, its own gateway gets the slot (from the reply
    or by claiming after the event), in global FIFO order, without the periodic refresh."""
    slots = worker(sync_redis, keys, 1)
    async with gateway(async_redis, keys, "gwa") as a, gateway(async_redis, keys, "gwb") as b:
        slot, waits = await four_waiting(a, b)
        assert await served_order(a, slot, waits) == [0, 1, 2, 3]
        await asyncio.sleep(0.2)
        assert_all_free(sync_redis, keys, slots)


async def test_tickets_redis_lost_go_back_at_once_in_their_order_once_a_lease_was_gone(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    """Redis losing the queue (restarted empty): a gateway whose lease key was gone puts its
    waiting tickets back at its next refresh, not after ``LOST_AFTER_S``, with the places they
    had, so the tickets of both gateways are back in arrival order before a slot is freed."""
    slots = worker(sync_redis, keys, 1)
    async with gateway(async_redis, keys, "gwa") as a, gateway(async_redis, keys, "gwb") as b:
        slot, waits = await four_waiting(a, b)
        queued = [t.decode() for t in sync_redis.zrange(keys.queue, 0, -1)]
        assert len(queued) == 4
        sync_redis.delete(keys.queue)  # what a restart leaves of it
        for qm in (a, b):
            await qm.refresh()  # a missing ticket is not taken for lost at once
        assert sync_redis.zcard(keys.queue) == 0
        for qm in (b, a):
            qm.keys_lost()
            await qm.refresh()
        assert [t.decode() for t in sync_redis.zrange(keys.queue, 0, -1)] == queued
        assert await served_order(a, slot, waits) == [0, 1, 2, 3]
        await asyncio.sleep(0.2)
        assert_all_free(sync_redis, keys, slots)
