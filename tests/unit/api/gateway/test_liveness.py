"""api/gateway/liveness.py: the sessions' lease and resume-owner checks, answered together per tick.

A real Redis; the relays that use these answers (lost worker, replaced session) are exercised
end to end by tests/e2e/test_failover.py, tests/e2e/test_resume*.py and tests/faults/.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from api.gateway import liveness
from api.gateway.liveness import Answer, Liveness
from omniserve.redis_server import start_embedded
from streaming import lua
from streaming.keys import Keys
from streaming.redis_connection import gateway_client
from tests.support.liveness_watches import watched
from tests.support.redis_cluster import RedisClusterSet
from tests.support.script_slots import slots_of


class CountingRedis(aioredis.Redis):
    """A client that counts its round trips: the commands it sends itself and its pipelines
    (a command sent inside a pipeline is not counted again)."""

    pipelines = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        CountingRedis.pipelines += 1
        return await super().execute_command(*args, **options)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        CountingRedis.pipelines += 1
        return super().pipeline(*args, **kwargs)


class Seen:
    """A watch that keeps what each tick told it, ``ticks`` times (then it stops watching)."""

    def __init__(self, ticks: int = 1_000_000) -> None:
        self.answers: list[Answer] = []
        self.ticks = ticks
        self.taken = 0  # answers ``next`` returned
        self.more = asyncio.Event()

    def __call__(self, answer: Answer) -> bool:
        self.answers.append(answer)
        self.more.set()
        return len(self.answers) < self.ticks

    async def next(self) -> Answer:
        """The next answer not yet returned (waiting for its tick)."""
        while len(self.answers) <= self.taken:
            self.more.clear()
            await asyncio.wait_for(self.more.wait(), 10)
        self.taken += 1
        return self.answers[self.taken - 1]


async def test_one_read_answers_every_watch(redis_server: str, keys: Keys) -> None:
    client = CountingRedis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)
    try:
        await client.set(keys.session_lease("a"), b"w1")
        await client.hset(keys.session_resume("a"), "conn", "c1")
        await client.hset(keys.session_resume("b"), "conn", "")
        await client.script_load(lua.LIVENESS)  # (not a round trip of the tick)
        watches = [Seen(1) for _ in range(6)]
        live.watch_lease("a", watches[0])
        live.watch_lease("b", watches[1])
        live.watch_replaced("a", "c1", watches[2])
        live.watch_replaced("a", "c2", watches[3])
        live.watch_replaced("b", "c1", watches[4])
        live.watch_replaced("gone", "c1", watches[5])
        CountingRedis.pipelines = 0
        live.start()
        got = [await w.next() for w in watches]
        # c2 asks about a session that c1 holds; "b" is detached; "gone" has no record
        assert got == [True, False, False, True, liveness.DETACHED, liveness.MISSING]
        assert CountingRedis.pipelines == 1
    finally:
        await live.stop()
        await client.delete(keys.session_lease("a"), *(keys.session_resume(s) for s in "ab"))
        await client.aclose()


async def test_a_watch_is_read_every_tick_until_it_stops(redis_server: str, keys: Keys) -> None:
    client = CountingRedis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)
    try:
        await client.set(keys.session_lease("s"), b"w1")
        await client.script_load(lua.LIVENESS)
        seen = Seen(ticks=3)
        live.watch_lease("s", seen)
        CountingRedis.pipelines = 0
        live.start()
        assert await seen.next() is True
        await client.delete(keys.session_lease("s"))  # the worker stopped renewing
        assert await seen.next() is False
        assert await seen.next() is False
        reads = CountingRedis.pipelines  # (three ticks and the delete)
        await asyncio.sleep(0.3)  # it stopped: nothing more is read
        assert seen.answers == [True, False, False]
        assert CountingRedis.pipelines == reads == 4
        assert live.leases == []
    finally:
        await live.stop()
        await client.aclose()


async def test_a_failed_read_is_told_to_its_watches_and_they_go_on(keys: Keys) -> None:
    # nothing listens on port 1; no retries (redis-py's default backs off between them), so
    # each tick's read fails at once
    client = aioredis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    live = Liveness(client, keys, tick_s=0.01)
    lease, owner = Seen(2), Seen(2)
    try:
        live.watch_lease("s", lease)
        live.watch_replaced("s", "c1", owner)
        live.start()
        for seen in (lease, owner):
            assert isinstance(await seen.next(), aioredis.ConnectionError)
            assert isinstance(await seen.next(), aioredis.ConnectionError)
    finally:
        await live.stop()
        await client.aclose()


async def test_a_failing_watch_is_dropped_and_the_others_are_told(
    redis_server: str, keys: Keys
) -> None:
    client = aioredis.Redis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)

    def broken(answer: Answer) -> bool:
        raise RuntimeError("a bug in a relay")

    try:
        await client.set(keys.session_lease("s"), b"w1")
        seen = Seen()
        live.watch_lease("s", broken)
        live.watch_lease("s", seen)
        live.start()
        assert await seen.next() is True
        assert await seen.next() is True
        assert [w for _, w in await watched(live, "leases")] == [seen]
    finally:
        await live.stop()
        await client.delete(keys.session_lease("s"))
        await client.aclose()


async def test_stop_drops_the_watches(redis_server: str, keys: Keys) -> None:
    client = aioredis.Redis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=60)
    live.start()
    seen = Seen()
    live.watch_replaced("s", "c1", seen)
    await live.stop()
    assert live.replaced == [] and seen.answers == []
    await client.aclose()


async def test_a_large_tick_is_read_in_parts(
    redis_server: str, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More keys than one script call reads: one call per part, and every answer still lands
    on its own watch (leases and resume records split across parts)."""
    monkeypatch.setattr(liveness, "KEYS_PER_CALL", 3)
    client = CountingRedis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)
    sids = [f"s{i}" for i in range(5)]
    try:
        for i, sid in enumerate(sids):
            if i % 2 == 0:
                await client.set(keys.session_lease(sid), b"w1")
            await client.hset(keys.session_resume(sid), "conn", "mine" if i < 3 else "theirs")
        await client.script_load(lua.LIVENESS)
        leases, owners = [Seen(1) for _ in sids], [Seen(1) for _ in sids]
        for sid, lease, owner in zip(sids, leases, owners, strict=True):
            live.watch_lease(sid, lease)
            live.watch_replaced(sid, "mine", owner)
        CountingRedis.pipelines = 0
        live.start()
        assert [await w.next() for w in leases] == [True, False, True, False, True]
        assert [await w.next() for w in owners] == [False, False, False, True, True]
        assert CountingRedis.pipelines == 4  # 10 keys, 3 a call
    finally:
        await live.stop()
        await client.delete(*(keys.session_lease(s) for s in sids))
        await client.delete(*(keys.session_resume(s) for s in sids))
        await client.aclose()


async def test_a_short_reply_fails_the_tick_and_the_next_is_read_as_usual(
    redis_server: str, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer that does not fit the watches fails them for that tick (never a wrong
    answer), and the next tick is read as usual."""
    client = aioredis.Redis.from_url(redis_server)
    live = Liveness(client, keys, tick_s=0.05)
    read = live._read

    async def short(keys: list[str], leases: int, conns: list[str]) -> bytes:
        return (await read(keys, leases, conns))[:-1]

    try:
        await client.set(keys.session_lease("s"), b"w1")
        monkeypatch.setattr(live, "_read", short)
        seen = Seen()
        live.watch_lease("s", seen)
        live.start()
        assert isinstance(await seen.next(), ValueError)
        monkeypatch.setattr(live, "_read", read)
        while await seen.next() is not True:  # (a tick already under way may fail too)
            pass
    finally:
        await live.stop()
        await client.delete(keys.session_lease("s"))
        await client.aclose()


async def test_a_lease_gone_through_a_redis_stall_reads_held_until_redis_settles(
    keys: Keys,
) -> None:
    """Redis frozen (SIGSTOP) past a lease's TTL: the read that ends the stall finds the lease
    gone, but it reads as held until Redis has answered on time for ``settle_s``; a lease gone
    after that is believed (streaming/stalls.py)."""
    server = start_embedded()
    client = aioredis.Redis.from_url(server.url)
    live = Liveness(client, keys, tick_s=0.05, settle_s=1.0)
    seen = Seen()
    try:
        await client.set(keys.session_lease("s"), b"w1", px=300)
        live.watch_lease("s", seen)
        live.start()
        assert await seen.next() is True
        os.killpg(server.process.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(0.8)  # the lease expires meanwhile
        finally:
            os.killpg(server.process.pid, signal.SIGCONT)
        thawed = time.monotonic()
        while (answer := await seen.next()) is True:
            pass
        assert answer is False
        assert time.monotonic() - thawed >= 0.9  # held while Redis settled
        assert not await client.exists(keys.session_lease("s"))
    finally:
        await live.stop()
        await client.aclose()
        server.stop()


async def test_a_read_that_times_out_reads_as_held_and_the_resume_watch_is_told(
    keys: Keys,
) -> None:
    """Redis frozen longer than the client's socket timeout: the read fails with a timeout.
    A lease or a worker's presence then reads as held (a stall says nothing of its worker, and
    failing on it would fail every session at once), while a resume-owner watch gets the
    error."""
    server = start_embedded()
    client = aioredis.Redis.from_url(server.url, socket_timeout=0.2)
    live = Liveness(client, keys, tick_s=0.05, settle_s=1.0)
    lease, worker, owner = Seen(), Seen(), Seen()
    try:
        await client.set(keys.session_lease("s"), b"w1")
        live.watch_lease("s", lease)
        live.watch_worker("w1", worker)
        live.watch_replaced("s", "c1", owner)
        live.start()
        assert await lease.next() is True
        os.killpg(server.process.pid, signal.SIGSTOP)
        try:
            answer = await owner.next()
            while not isinstance(answer, Exception):
                answer = await owner.next()
        finally:
            os.killpg(server.process.pid, signal.SIGCONT)
        assert isinstance(answer, aioredis.TimeoutError)
        assert lease.answers[owner.taken - 1] is True
        assert worker.answers[owner.taken - 1] is True  # (its key was never there)
    finally:
        await live.stop()
        await client.aclose()
        server.stop()


async def test_on_a_cluster_the_same_questions_get_the_same_answers(keys: Keys) -> None:
    """On a Redis Cluster a tick's keys live on many slots: the same answers come from plain
    commands the cluster client routes (``Liveness._read_routed``), with Redis's clock."""
    cluster = RedisClusterSet()
    cluster.start()
    client = gateway_client(cluster.url, 20)
    live = Liveness(client, keys, tick_s=0.05)
    try:
        sids = [f"rt_1_{i:02x}" for i in range(12)]  # spread over the shards
        for sid in sids[::2]:
            await client.set(keys.session_lease(sid), b"w1")
            await client.hset(keys.session_resume(sid), "conn", "c1")
        await client.hset(keys.session_resume(sids[1]), "conn", "")
        await client.set(keys.worker_alive("w#1"), b"1")
        leases = [Seen(1) for _ in sids]
        owners = [Seen(1) for _ in sids]
        worker = Seen(1)
        for sid, lease, owner in zip(sids, leases, owners, strict=True):
            live.watch_lease(sid, lease)
            live.watch_replaced(sid, "c2", owner)
        live.watch_worker("w#1", worker)
        before = time.time()
        await live.check()
        assert [w.answers for w in leases] == [[i % 2 == 0] for i in range(12)]
        expected: list[Answer] = [True if i % 2 == 0 else liveness.MISSING for i in range(12)]
        expected[1] = liveness.DETACHED
        assert [w.answers for w in owners] == [[a] for a in expected]
        assert worker.answers == [True]
        assert live._server_s is not None and abs(live._server_s - before) < 60
        assert len(slots_of([keys.session_lease(s) for s in sids])) > 1
    finally:
        await live.stop()
        await client.aclose()
        cluster.stop()
