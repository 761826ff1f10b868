"""A relay loop sleeps until something wakes it (api/realtime/duplex.py): the wake itself
(``SessionOutput.wake``) and the lease watch of ``TaskRelay``, which reads its worker's lease at
every tick of the gateway's liveness read without waking the reader, and wakes it only when the
lease lapsed. A real Redis and a real ``Liveness``; the whole loop is exercised end to
end by the failover, resume and conformance tests, whose gateways run with the loop's backstop
set to ten minutes (``tests/support/stack.py``), so that only these wakes can end its sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio as aioredis

from api.gateway.liveness import Answer, Liveness
from api.relay.task import TaskNotStarted, TaskRelay, WorkerLost
from omnicore.settings import Settings
from streaming.events import Started, TextDelta
from streaming.keys import Keys
from streaming.output import OutputBus, SessionOutput
from tests.support.liveness_watches import watched

SID = "rt_wake"
TICK_S = 0.05
LONG_S = 30.0  # a wait that only a wake (or an event) ends within the test's time


@pytest.fixture
async def live(async_redis: aioredis.Redis, keys: Keys) -> AsyncIterator[Liveness]:
    lv = Liveness(async_redis, keys, tick_s=TICK_S)
    lv.start()
    try:
        yield lv
    finally:
        await lv.stop()


async def test_a_wake_ends_the_wait_at_once_and_is_kept_when_nobody_waits(
    bus: OutputBus,
) -> None:
    out = await bus.open(SID)
    waiting = asyncio.ensure_future(out.get(timeout=LONG_S))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    out.wake()
    assert await asyncio.wait_for(waiting, 5) == []
    out.wake()  # nobody waits: the next wait ends at once
    assert await asyncio.wait_for(out.get(timeout=LONG_S), 5) == []
    out.push(TextDelta(seq=1, text="a"))  # an event still arrives after the wakes
    got = await asyncio.wait_for(out.get(timeout=LONG_S), 5)
    assert [e.seq for e in got] == [1]
    await bus.close(SID, out)
    assert out.closed


async def watched_relay(
    bus: OutputBus, live: Liveness, async_redis: aioredis.Redis, keys: Keys
) -> tuple[TaskRelay, SessionOutput]:
    """A started task's relay whose worker renews its lease; its first look starts the watch."""
    await async_redis.set(keys.session_lease(SID), b"w1", px=60_000)
    out = await bus.open(SID)
    gateway: Any = SimpleNamespace(liveness=live, settings=Settings())
    relay = TaskRelay(gateway, out, SID, "slot", "session")
    relay.started = True
    await relay.next(0.01)
    return relay, out


async def test_a_live_lease_is_read_every_tick_without_waking_the_reader(
    bus: OutputBus, live: Liveness, async_redis: aioredis.Redis, keys: Keys
) -> None:
    relay, out = await watched_relay(bus, live, async_redis, keys)
    reads = 0
    [(sid, watch)] = await watched(live, "leases")

    def counted(answer: Answer) -> bool:
        nonlocal reads
        reads += 1
        return watch(answer)

    live.leases = [(sid, counted)]
    waiting = asyncio.ensure_future(relay.next(LONG_S))
    await asyncio.sleep(20 * TICK_S)
    assert not waiting.done()  # not woken by the live lease's reads
    assert reads >= 10  # yet read at every tick
    await async_redis.delete(keys.session_lease(SID))  # the worker stopped renewing
    assert await asyncio.wait_for(waiting, 10) == []  # woken: what the log held (nothing)
    with pytest.raises(WorkerLost):
        await relay.next(LONG_S)
    await bus.close(SID, out)


async def test_nothing_is_asked_once_the_relay_is_over(
    bus: OutputBus, live: Liveness, async_redis: aioredis.Redis, keys: Keys
) -> None:
    _, out = await watched_relay(bus, live, async_redis, keys)
    await asyncio.sleep(4 * TICK_S)
    assert [sid for sid, _ in await watched(live, "leases")] == [SID]
    await bus.close(SID, out)
    await asyncio.sleep(6 * TICK_S)
    assert live.leases == []  # read once more, then dropped
    await async_redis.delete(keys.session_lease(SID))


async def test_a_task_whose_worker_process_is_gone_before_it_starts_ends_at_once(
    bus: OutputBus, live: Liveness, async_redis: aioredis.Redis, keys: Keys
) -> None:
    """The slot's worker process died after the slot was handed out: the task will never start,
    so the tick that finds its presence key gone wakes the relay, which abandons the task then,
    not at ``task_start_timeout_s``."""
    await async_redis.set(keys.worker_alive("w#1"), b"1", px=60_000)
    out = await bus.open(SID)
    abandoned: list[tuple[str, str]] = []

    async def abandon(claim_id: str, slot_id: str) -> bool:
        abandoned.append((claim_id, slot_id))
        return True

    gateway: Any = SimpleNamespace(
        liveness=live, settings=Settings(task_start_timeout_s=LONG_S), abandon=abandon
    )
    relay = TaskRelay(gateway, out, SID, "w#1|0", "session")
    assert await relay.next(0.01) == []  # the first look starts the watch
    waiting = asyncio.ensure_future(relay.next(LONG_S))
    await asyncio.sleep(10 * TICK_S)
    assert not waiting.done()  # the worker is alive: its reads do not wake the relay
    assert [wid for wid, _ in await watched(live, "workers")] == ["w#1"]
    await async_redis.delete(keys.worker_alive("w#1"))  # its Celery parent saw it die
    with pytest.raises(TaskNotStarted, match="worker process of its slot is gone"):
        await asyncio.wait_for(waiting, 10)
    assert abandoned == [(SID, "w#1|0")]
    await asyncio.sleep(4 * TICK_S)
    assert live.workers == []
    await bus.close(SID, out)


async def test_a_started_task_no_longer_watches_its_worker(
    bus: OutputBus, live: Liveness, async_redis: aioredis.Redis, keys: Keys
) -> None:
    await async_redis.set(keys.worker_alive("w#1"), b"1", px=60_000)
    await async_redis.set(keys.session_lease(SID), b"w#1", px=60_000)
    out = await bus.open(SID)
    gateway: Any = SimpleNamespace(liveness=live, settings=Settings())
    relay = TaskRelay(gateway, out, SID, "w#1|0", "session")
    await relay.next(0.01)
    assert [wid for wid, _ in await watched(live, "workers")] == ["w#1"]
    out.push(Started(seq=1, worker_id="w#1"))
    assert await relay.next(5) == []  # Started is consumed
    assert relay.started
    await asyncio.sleep(4 * TICK_S)
    assert live.workers == []  # read once more, then dropped
    await async_redis.delete(keys.worker_alive("w#1"))
    await asyncio.sleep(4 * TICK_S)
    assert relay.started  # the lease, not the presence, watches a running task
    await bus.close(SID, out)
