"""streaming/admission.py against a real Redis: the global FIFO as a gateway sees it."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis

from streaming.admission import Admission, QueueFull
from streaming.keys import Keys
from streaming.slots import WorkerRegistry

GW = "gw1"


def worker(sync_redis: redis.Redis, keys: Keys, wid: str, slots: int) -> WorkerRegistry:
    reg = WorkerRegistry(sync_redis, keys, wid, lease_ttl_s=30)
    reg.register({"slots": slots})
    reg.heartbeat(reg.slot_ids(slots), {})
    return reg


@pytest.fixture
async def admission(async_redis: aioredis.Redis, keys: Keys) -> Admission:
    await async_redis.set(keys.gateway_alive(GW), b"1", ex=30)
    return Admission(async_redis, keys)


def ticket(n: int, gw: str = GW) -> str:
    return f"ticket_{gw}_{n}"


async def test_fifo_dispatch_assignment_and_release(
    admission: Admission, sync_redis: redis.Redis, keys: Keys
) -> None:
    worker(sync_redis, keys, "w#1", 1)
    assert await admission.enqueue(ticket(1), max_queue=10) == 1
    assert await admission.enqueue(ticket(2), max_queue=10) == 2
    assert await admission.dispatch() == [(ticket(1), "w#1|0")]  # oldest first, one slot
    assert await admission.dispatch() == []
    assert await admission.take_assignment(ticket(1)) == "w#1|0"
    assert await admission.take_assignment(ticket(1)) is None  # exactly once
    snap = await admission.snapshot()
    assert snap.order == {ticket(2): 1} and snap.live_slots == 1
    assert await admission.release("w#1|0") is True
    assert await admission.release("w#1|0") is False  # a second release is a no-op
    assert await admission.dispatch() == [(ticket(2), "w#1|0")]


async def test_queue_full_counts_idle_slots(
    admission: Admission, sync_redis: redis.Redis, keys: Keys
) -> None:
    worker(sync_redis, keys, "w#1", 2)
    for n in range(1, 4):  # 2 idle slots + 1 waiting
        await admission.enqueue(ticket(n), max_queue=1)
    with pytest.raises(QueueFull):
        await admission.enqueue(ticket(4), max_queue=1)


async def test_leave_before_and_after_dispatch(
    admission: Admission, sync_redis: redis.Redis, keys: Keys
) -> None:
    worker(sync_redis, keys, "w#1", 1)
    await admission.enqueue(ticket(1), max_queue=10)
    assert await admission.leave(ticket(1)) is None  # still waiting: just removed
    await admission.enqueue(ticket(2), max_queue=10)
    await admission.dispatch()
    assert await admission.leave(ticket(2)) == "w#1|0"  # assigned meanwhile: given back
    assert sync_redis.lrange(keys.free_slots, 0, -1) == [b"w#1|0"]


async def test_dead_gateways_tickets_and_dead_workers_slots_are_skipped(
    admission: Admission, sync_redis: redis.Redis, keys: Keys
) -> None:
    worker(sync_redis, keys, "w#dead", 1)
    sync_redis.delete(keys.worker_alive("w#dead"))
    await admission.enqueue(ticket(1, gw="gone"), max_queue=10)
    await admission.enqueue(ticket(2), max_queue=10)
    assert await admission.dispatch() == []  # the dead worker's slot is dropped, not handed out
    assert (await admission.snapshot()).order == {ticket(2): 1}  # the dead gateway's ticket too
    assert sync_redis.hkeys(keys.queue_info) == [ticket(2).encode()]  # and its record
    worker(sync_redis, keys, "w#2", 1)
    assert await admission.dispatch() == [(ticket(2), "w#2|0")]


async def test_estimates_and_reaping(
    admission: Admission, sync_redis: redis.Redis, keys: Keys
) -> None:
    worker(sync_redis, keys, "w#1", 2)
    sync_redis.hset(keys.duration_stats, "ema_s", 10.0)
    for n in range(1, 6):
        await admission.enqueue(ticket(n), max_queue=10)
    await admission.dispatch()  # 2 admitted, 3 waiting
    snap = await admission.snapshot()
    assert snap.length == 3 and snap.mean_hold_s == 10.0
    assert [snap.estimated_wait_s(p) for p in (1, 2, 3)] == [10, 10, 20]
    sync_redis.delete(keys.worker_alive("w#1"))  # the worker died holding both slots
    assert await admission.reap_busy() == 2
    assert not sync_redis.hexists(keys.workers, "w#1")
    assert await admission.live_slot_count() == 0


async def test_failover_tickets_go_first_in_their_own_order_and_are_never_full(
    admission: Admission, sync_redis: redis.Redis, keys: Keys
) -> None:
    """A failover's ticket (``front``) goes ahead of every ordinary one, after earlier failover
    tickets, even when the queue is full."""
    await admission.enqueue(ticket(1), max_queue=2)
    await admission.enqueue(ticket(2), max_queue=2)
    with pytest.raises(QueueFull):
        await admission.enqueue(ticket(3), max_queue=2)
    assert await admission.enqueue(ticket(4), max_queue=2, front=True) == 1
    assert await admission.enqueue(ticket(5), max_queue=2, front=True) == 2
    snap = await admission.snapshot()
    assert snap.order == {ticket(4): 1, ticket(5): 2, ticket(1): 3, ticket(2): 4}
    worker(sync_redis, keys, "w#1", 1)
    assert await admission.dispatch() == [(ticket(4), "w#1|0")]


async def test_enqueue_and_dispatch_in_one_step(
    admission: Admission, sync_redis: redis.Redis, keys: Keys
) -> None:
    """The same outcome as ``enqueue`` followed by ``dispatch``, in one script."""
    worker(sync_redis, keys, "w#1", 1)
    assert await admission.enqueue(ticket(1), max_queue=10) == 1
    # the older ticket gets the idle slot; the new one waits behind nobody
    assert await admission.enqueue_and_dispatch(ticket(2), max_queue=10) == (
        2,
        [(ticket(1), "w#1|0")],
    )
    assert await admission.take_assignment(ticket(1)) == "w#1|0"
    assert await admission.enqueue_and_dispatch(ticket(3), max_queue=2) == (2, [])
    with pytest.raises(QueueFull):
        await admission.enqueue_and_dispatch(ticket(4), max_queue=2)
    assert await admission.release("w#1|0")
    assert await admission.enqueue_and_dispatch(ticket(5), max_queue=10) == (
        3,
        [(ticket(2), "w#1|0")],
    )
    assert await admission.enqueue_and_dispatch(ticket(6), max_queue=0, front=True) == (1, [])


async def test_dispatch_and_snapshot_in_one_pipeline_survives_a_flushed_script_cache(
    admission: Admission, sync_redis: redis.Redis, keys: Keys
) -> None:
    """The refresh's pipelined DISPATCH (a plain EVALSHA) after Redis lost its scripts (a
    restart): it falls back to loading the script, and the pairs still reach the callback."""
    worker(sync_redis, keys, "w#1", 1)
    await admission.enqueue(ticket(1), max_queue=10)
    await admission.enqueue(ticket(2), max_queue=10)
    sync_redis.script_flush()
    got: list[list[tuple[str, str]]] = []

    def on_dispatch(pairs: list[tuple[str, str]]) -> bool:
        got.append(pairs)
        return True

    snap = await admission.dispatch_and_snapshot(GW, on_dispatch)
    assert got == [[(ticket(1), "w#1|0")]]
    assert snap is not None and snap.order == {ticket(2): 1}
    assert await admission.release("w#1|0")

    def nobody_left(pairs: list[tuple[str, str]]) -> bool:
        got.append(pairs)
        return False

    snap = await admission.dispatch_and_snapshot(GW, nobody_left)
    assert snap is None and got[-1] == [(ticket(2), "w#1|0")]  # nobody needs the rest


async def test_the_snapshot_knows_what_runs_and_waits_mode_by_mode(
    admission: Admission, sync_redis: redis.Redis, keys: Keys
) -> None:
    """The scripts keep each waiting ticket's mode and each dispatched slot's mode and dispatch
    time (Redis's clock), so any gateway's estimate sees a chat turn waiting behind an audio
    session 10 s into its typical 20 s: about 10 s, where the mean of all holds says 4."""
    worker(sync_redis, keys, "w#1", 1)
    sync_redis.hset(keys.duration_stats, mapping={"ema_s": 4.0, "ema_s:audio": 20.0})
    await admission.enqueue_and_dispatch(ticket(1), 10, mode="audio", cap_s=600)
    assert await admission.take_assignment(ticket(1)) == "w#1|0"
    mode, deadline, since = sync_redis.hget(keys.running_slots, "w#1|0").decode().split("|")
    assert mode == "audio" and 599 < float(deadline) - float(since) <= 600
    sync_redis.hset(keys.running_slots, "w#1|0", f"audio|0|{float(since) - 10:.3f}")
    await admission.enqueue_and_dispatch(ticket(2), 10, mode="chat", cap_s=None)
    assert sync_redis.hget(keys.queue_info, ticket(2)).startswith(b"chat|")
    snap = await admission.snapshot()
    assert [r.mode for r in snap.running] == ["audio"] and snap.waiting[0].mode == "chat"
    assert snap.mode_hold_s == {"audio": 20.0}
    assert 9 <= snap.estimated_wait_s(1) <= 10
    # a worker that is not ready serves the queue no more: its sessions do not count
    sync_redis.delete(keys.worker_alive("w#1"))
    assert (await admission.snapshot()).running == []
    worker(sync_redis, keys, "w#1", 1)
    # leaving drops the ticket's record; a release the slot's
    await admission.leave(ticket(2))
    assert not sync_redis.hexists(keys.queue_info, ticket(2))
    assert await admission.release("w#1|0")
    assert not sync_redis.exists(keys.running_slots)
    assert sync_redis.hget(keys.duration_stats, "ema_s:audio") == b"20.0"  # (no hold recorded)


async def test_tickets_put_back_with_their_scores_keep_their_arrival_order(
    admission: Admission, async_redis: aioredis.Redis, keys: Keys
) -> None:
    """Redis restarted empty: each gateway puts its waiting tickets back, in whatever order the
    gateways get to it, with the scores they had; later tickets come after them."""
    for n in range(1, 5):
        await admission.enqueue(ticket(n), max_queue=10)
    scores = (await admission.snapshot()).scores
    assert [scores[ticket(n)] for n in range(1, 5)] == [1.0, 2.0, 3.0, 4.0]
    await async_redis.delete(keys.queue, keys.queue_seq, keys.queue_info)  # lost
    for n in (2, 4, 1, 3):  # put back out of order
        await admission.enqueue(ticket(n), max_queue=10, score=scores[ticket(n)])
    await admission.enqueue(ticket(5), max_queue=10)  # a new arrival
    snap = await admission.snapshot()
    assert snap.order == {ticket(n): n for n in range(1, 6)}
