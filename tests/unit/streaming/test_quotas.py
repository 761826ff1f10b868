"""streaming/quotas.py: concurrent sessions and daily minutes per key, at admission."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from streaming import quotas
from streaming.keys import Keys
from streaming.keystore import KeyQuota
from streaming.quotas import QuotaHolds, Refusal
from streaming.usage import Usage, UsageLedger

TWO = KeyQuota(max_sessions=2)


async def test_concurrent_sessions_across_gateways(async_redis: aioredis.Redis, keys: Keys) -> None:
    a, b = QuotaHolds(async_redis, keys), QuotaHolds(async_redis, keys)
    now = time.time()
    assert await a.admit("acme", "s1", TWO, now) is None
    assert await b.admit("acme", "s2", TWO, now) is None
    assert await b.admit("acme", "s3", TWO, now) is Refusal.SESSIONS
    assert await a.admit("other-key", "s3", TWO, now) is None  # its own count
    # the same session again (a resume, a failover) keeps its one place
    assert await b.admit("acme", "s1", TWO, now) is None
    assert await b.admit("acme", "s1", TWO, now, claim=True) is None
    assert await async_redis.zcard(keys.key_sessions("acme")) == 2
    await a.release("acme", "s1")
    await a.release("acme", "s1")  # twice: still one place freed, never below zero
    assert await async_redis.zcard(keys.key_sessions("acme")) == 1
    assert await a.admit("acme", "s4", TWO, now) is None
    assert await a.admit("acme", "s5", TWO, now) is Refusal.SESSIONS


async def test_a_claim_is_never_refused(async_redis: aioredis.Redis, keys: Keys) -> None:
    holds = QuotaHolds(async_redis, keys)
    one = KeyQuota(max_sessions=1)
    assert await holds.admit("acme", "s1", one, time.time()) is None
    assert await holds.admit("acme", "s2", one, time.time(), claim=True) is None


async def test_holds_lapse_unless_renewed(
    async_redis: aioredis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quotas, "HOLD_S", 0.5)
    live, dead = QuotaHolds(async_redis, keys), QuotaHolds(async_redis, keys)
    one = KeyQuota(max_sessions=2)
    assert await live.admit("acme", "s1", one, time.time()) is None
    assert await dead.admit("acme", "s2", one, time.time()) is None
    deadline = time.monotonic() + 10
    while await async_redis.zscore(keys.key_sessions("acme"), "s2") is not None:
        await live.renew()  # the live gateway renews; the dead one's hold lapses
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
        await live.admit("acme", "probe", KeyQuota(max_sessions=1), time.time())  # (prunes)
        await live.release("acme", "probe")
    assert await async_redis.zscore(keys.key_sessions("acme"), "s1") is not None
    await live.release("acme", "s1")
    await async_redis.zadd(keys.key_sessions("acme"), {"s9": 1.0})  # lapsed long ago
    await live.renew()  # a released hold is not brought back; a lapsed one is dropped at admit
    assert await live.admit("acme", "s10", KeyQuota(max_sessions=1), time.time()) is None


async def test_minutes_per_day(async_redis: aioredis.Redis, keys: Keys) -> None:
    holds, ledger = QuotaHolds(async_redis, keys), UsageLedger(async_redis, keys)
    quota = KeyQuota(minutes_per_day=1)
    now = time.time()
    assert await holds.admit("acme", "s1", quota, now) is None
    await holds.release("acme", "s1")
    await ledger.record("acme", Usage(session_s=59.0), now)
    assert await holds.admit("acme", "s2", quota, now) is None
    await holds.release("acme", "s2")
    await ledger.record("acme", Usage(session_s=1.0), now)
    assert await holds.admit("acme", "s3", quota, now) is Refusal.MINUTES
    assert await async_redis.zcard(keys.key_sessions("acme")) == 0  # nothing held for it


async def test_no_quota_no_redis(async_redis: aioredis.Redis, keys: Keys) -> None:
    holds = QuotaHolds(async_redis, keys)
    assert await holds.admit("acme", "s1", KeyQuota(max_session_s=5), time.time()) is None
    assert not await async_redis.exists(keys.key_sessions("acme"))
