"""streaming/chat_requests.py: a chat turn's request waits in Redis and is read exactly once."""

from __future__ import annotations

import itertools

import pytest
import redis
import redis.asyncio as aioredis

from streaming.chat_requests import (
    TTL_MARGIN_S,
    drop_chat_request,
    store_chat_request,
)
from streaming.jobs import claim_id
from streaming.keys import Keys
from streaming.session_claim import SessionClaimer

pytestmark = pytest.mark.asyncio


def take(client: redis.Redis, keys: Keys, turn_id: str) -> dict | None:
    """What a worker's claim of a fresh attempt of the turn reads (each call claims anew)."""
    claimer = SessionClaimer(client, keys, "w#1", claim_ttl_s=60, lease_ttl_s=5)
    claimed = claimer.claim(claim_id(turn_id, next(ATTEMPTS)), "w#1|0", turn_id, chat_turn=True)
    assert claimed is not None
    return claimed.request


ATTEMPTS = itertools.count(1)  # each claim a new attempt's (``<turn id>.r<n>``)

REQUEST = {"messages": [{"role": "user", "content": "hello"}], "tts": {"enabled": False}}


async def test_stored_then_taken_once(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    await store_chat_request(async_redis, keys, "t1", REQUEST, start_timeout_s=15)
    ttl = await async_redis.ttl(keys.chat_request("t1"))
    assert 15 < ttl <= 15 + TTL_MARGIN_S
    assert take(sync_redis, keys, "t1") == REQUEST
    assert take(sync_redis, keys, "t1") is None  # read once
    assert take(sync_redis, keys, "never-stored") is None


async def test_dropped_when_no_task_took_it(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    await store_chat_request(async_redis, keys, "t2", REQUEST, start_timeout_s=15)
    await drop_chat_request(async_redis, keys, "t2")
    assert take(sync_redis, keys, "t2") is None
