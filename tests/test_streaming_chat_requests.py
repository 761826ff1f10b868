"""streaming/chat_requests.py: a chat turn's request waits in Redis and is read exactly once."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis

from streaming.chat_requests import (
    TTL_MARGIN_S,
    drop_chat_request,
    store_chat_request,
    take_chat_request,
)
from streaming.keys import Keys

pytestmark = pytest.mark.asyncio

REQUEST = {"messages": [{"role": "user", "content": "hello"}], "tts": {"enabled": False}}


async def test_stored_then_taken_once(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    await store_chat_request(async_redis, keys, "t1", REQUEST, start_timeout_s=15)
    ttl = await async_redis.ttl(keys.chat_request("t1"))
    assert 15 < ttl <= 15 + TTL_MARGIN_S
    assert take_chat_request(sync_redis, keys, "t1") == REQUEST
    assert take_chat_request(sync_redis, keys, "t1") is None  # read once
    assert take_chat_request(sync_redis, keys, "never-stored") is None


async def test_dropped_when_no_task_took_it(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    await store_chat_request(async_redis, keys, "t2", REQUEST, start_timeout_s=15)
    await drop_chat_request(async_redis, keys, "t2")
    assert take_chat_request(sync_redis, keys, "t2") is None
