"""streaming/connections.py: connections per client address, counted across gateways in Redis."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from streaming.connections import ClientConnections, TooManyConnections
from streaming.keys import Keys

pytestmark = pytest.mark.asyncio

ADDR = "203.0.113.7"


async def gateway(r: aioredis.Redis, keys: Keys, gid: str, limit: int = 2) -> ClientConnections:
    """A gateway's limiter, with the gateway's alive key as a live gateway has it."""
    await r.set(keys.gateway_alive(gid), b"1", ex=60)
    return ClientConnections(r, keys, gid, limit)


async def test_limit_counts_across_gateways(async_redis: aioredis.Redis, keys: Keys) -> None:
    a = await gateway(async_redis, keys, "gwa")
    b = await gateway(async_redis, keys, "gwb")
    await a.acquire(ADDR)
    await b.acquire(ADDR)
    for gw in (a, b):
        with pytest.raises(TooManyConnections):
            await gw.acquire(ADDR)
    await b.acquire("198.51.100.1")  # another address has its own count
    await a.release(ADDR)
    await b.acquire(ADDR)
    counts = await async_redis.hgetall(keys.client_connections(ADDR))
    assert counts == {b"gwb": b"2"}
    assert a.local == {} and b.local == {ADDR: 2, "198.51.100.1": 1}
    assert 0 < await async_redis.ttl(keys.client_connections(ADDR)) <= 60


async def test_a_dead_gateways_connections_stop_counting(
    async_redis: aioredis.Redis, keys: Keys
) -> None:
    dead = await gateway(async_redis, keys, "gwdead")
    live = await gateway(async_redis, keys, "gwlive")
    await dead.acquire(ADDR)
    await dead.acquire(ADDR)
    with pytest.raises(TooManyConnections):
        await live.acquire(ADDR)
    await async_redis.delete(keys.gateway_alive("gwdead"))  # its alive key lapsed
    await live.acquire(ADDR)
    assert await async_redis.hgetall(keys.client_connections(ADDR)) == {b"gwlive": b"1"}


async def test_sync_rewrites_what_redis_lost(async_redis: aioredis.Redis, keys: Keys) -> None:
    gw = await gateway(async_redis, keys, "gws")
    await gw.acquire(ADDR)
    await gw.acquire("192.0.2.9")
    await gw.release("192.0.2.9")
    await async_redis.delete(keys.client_connections(ADDR))  # Redis restarted empty
    await async_redis.hset(keys.client_connections("192.0.2.9"), "gws", 5)  # a lost release
    gw._dirty.add("192.0.2.9")
    await gw.sync()
    assert await async_redis.hgetall(keys.client_connections(ADDR)) == {b"gws": b"1"}
    assert await async_redis.hgetall(keys.client_connections("192.0.2.9")) == {}


async def test_no_limit_means_no_redis_traffic(async_redis: aioredis.Redis, keys: Keys) -> None:
    gw = await gateway(async_redis, keys, "gw0", limit=0)
    for _ in range(10):
        await gw.acquire(ADDR)
    await gw.release(ADDR)
    assert not await async_redis.exists(keys.client_connections(ADDR))
