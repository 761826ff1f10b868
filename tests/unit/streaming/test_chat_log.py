"""The chat turn lease (``ChatLog``) on a real Redis: one connection runs a turn at a time, and a
connection's next turn takes its lease over before the last one's hand-back lands."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from streaming.chat_log import ChatLog
from streaming.keys import Keys

TTL_S = 5.0


def chat_log(client: aioredis.Redis, keys: Keys) -> ChatLog:
    return ChatLog(client, keys, "sess", maxlen=100, ttl_s=60)


async def test_a_free_lease_is_taken_and_another_connection_refused(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    log = chat_log(async_redis, keys)
    assert await log.take_turn("connA", 1, TTL_S)
    assert await log.turn_holder() == "connA"
    assert not await log.take_turn("connB", 1, TTL_S)
    assert not await log.renew_turn("connB", 1, TTL_S)
    assert await log.turn_holder() == "connA"
    ttl_ms = sync_redis.pttl(keys.chat_turn_lease("sess"))
    assert 0 < ttl_ms <= TTL_S * 1000
    await log.release_turn("connB", 1)  # not its lease: left alone
    assert await log.turn_holder() == "connA"
    await log.release_turn("connA", 1)
    assert await log.turn_holder() is None
    assert await log.take_turn("connB", 1, TTL_S)


async def test_the_next_turn_takes_the_lease_over_and_the_late_hand_back_leaves_it(
    async_redis: aioredis.Redis, keys: Keys
) -> None:
    log = chat_log(async_redis, keys)
    assert await log.take_turn("connA", 1, TTL_S)
    assert await log.take_turn("connA", 2, TTL_S)  # turn 1's hand-back not there yet
    await log.release_turn("connA", 1)  # ... and here it is, late
    assert await log.turn_holder() == "connA"
    assert not await log.renew_turn("connA", 1, TTL_S)  # a late renewal of turn 1 neither
    assert await log.renew_turn("connA", 2, TTL_S)
    await log.release_turn("connA", 2)
    assert await log.turn_holder() is None


async def test_a_renewal_takes_back_a_lease_redis_lost(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    log = chat_log(async_redis, keys)
    assert await log.take_turn("connA", 3, TTL_S)
    sync_redis.delete(keys.chat_turn_lease("sess"))  # a Redis restart without persistence
    assert await log.renew_turn("connA", 3, TTL_S)
    assert await log.turn_holder() == "connA"


async def test_taking_the_lease_sets_the_record_field_either_way(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    log = chat_log(async_redis, keys)
    record = keys.session_resume("sess")
    assert await log.take_turn("connA", 1, TTL_S, (record, "inputs", 1))
    assert not await log.take_turn("connB", 1, TTL_S, (record, "inputs", 2))
    assert sync_redis.hget(record, "inputs") == b"2"
