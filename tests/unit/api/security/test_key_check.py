"""api/security/key_check.py: which key a connection presented, or why it is refused."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from api.security.key_check import KeyRefused, identify
from streaming.keys import Keys
from streaming.keystore import KeyQuota, KeyStore


async def test_flat_named_and_no_keys(async_redis: aioredis.Redis, keys: Keys) -> None:
    store = KeyStore(async_redis, keys, cache_s=0)
    assert (await identify(None, [], store)).name == "anonymous"  # nothing configured
    flat = [SecretStr("flat-key")]
    assert (await identify("flat-key", flat, store)).name == "settings"
    with pytest.raises(KeyRefused, match="missing"):
        await identify(None, flat, store)
    secret, _ = await store.create("acme", KeyQuota(max_sessions=3))
    found = await identify(secret, [], store)
    assert found.name == "acme" and found.quota.max_sessions == 3
    assert (await identify(secret, flat, store)).name == "acme"  # both kinds work together
    with pytest.raises(KeyRefused, match="missing or invalid"):
        await identify(None, [], store)  # a named key exists: a key is required now
    with pytest.raises(KeyRefused, match="missing or invalid"):
        await identify("osk_unknown", [], store)
    with pytest.raises(KeyRefused, match="malformed"):
        await identify("bad\x00key", [], store)
    await store.revoke("acme")
    with pytest.raises(KeyRefused, match="revoked"):
        await identify(secret, [], store)


async def test_a_key_can_be_required_whatever_redis_holds(
    async_redis: aioredis.Redis, keys: Keys
) -> None:
    store = KeyStore(async_redis, keys, cache_s=0)  # empty, as a Redis restarted without data
    with pytest.raises(KeyRefused, match="missing or invalid"):
        await identify(None, [], store, required=True)
    with pytest.raises(KeyRefused):
        await identify("osk_whatever", [], store, required=True)
    secret, _ = await store.create("acme")
    assert (await identify(secret, [], store, required=True)).name == "acme"
