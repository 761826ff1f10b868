"""streaming/keystore.py: named keys in Redis, hashed, with each gateway's short cache."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
import redis.asyncio as aioredis

from streaming.keys import Keys
from streaming.keystore import KeyProblem, KeyQuota, KeyStore, check_name, well_formed


async def test_create_stores_only_the_hash(async_redis: aioredis.Redis, keys: Keys) -> None:
    store = KeyStore(async_redis, keys, cache_s=0)
    secret, rec = await store.create("acme", KeyQuota(max_sessions=2))
    assert secret.startswith("osk_") and len(secret) > 40
    assert rec.digest == hashlib.sha256(secret.encode()).hexdigest()
    everything = b""
    for k in (keys.api_keys, keys.api_key_names):
        everything += b"".join(await async_redis.hvals(k))
    assert secret.encode() not in everything
    found = await store.lookup(secret)
    assert found is not None and found.name == "acme" and found.quota.max_sessions == 2
    assert await store.lookup(secret + "x") is None
    assert await store.any_keys()
    with pytest.raises(KeyProblem, match="already"):
        await store.create("acme")


async def test_rotate_and_revoke(async_redis: aioredis.Redis, keys: Keys) -> None:
    store = KeyStore(async_redis, keys, cache_s=0)
    old, _ = await store.create("beta")
    new, rec = await store.rotate("beta")
    assert new != old and rec.rotated_at is not None
    assert await store.lookup(old) is None
    assert (await store.lookup(new)) is not None
    revoked = await store.revoke("beta")
    assert revoked.revoked
    again = await store.lookup(new)
    assert again is not None and again.revoked  # told apart from an unknown key
    with pytest.raises(KeyProblem):
        await store.rotate("beta")
    with pytest.raises(KeyProblem):
        await store.revoke("nobody")
    # a revoked name may name a new key; the listing shows every name once
    fresh, _ = await store.create("beta")
    assert (await store.lookup(fresh)) is not None and await store.lookup(new) is None
    assert [r.name for r in await store.records()] == ["beta"]


async def test_quota_changes_keep_the_key(async_redis: aioredis.Redis, keys: Keys) -> None:
    store = KeyStore(async_redis, keys, cache_s=0)
    secret, _ = await store.create("gamma")
    await store.set_quota("gamma", KeyQuota(minutes_per_day=30, max_session_s=120))
    rec = await store.lookup(secret)
    assert rec is not None and rec.quota == KeyQuota(None, 30.0, 120.0)
    assert (await store.records())[0].public()["quota"] == {
        "max_sessions": None,
        "minutes_per_day": 30.0,
        "max_session_s": 120.0,
    }


async def test_another_gateway_sees_a_revocation_within_its_cache(
    async_redis: aioredis.Redis, keys: Keys
) -> None:
    admin = KeyStore(async_redis, keys)
    gateway = KeyStore(async_redis, keys, cache_s=0.3)
    secret, _ = await admin.create("delta")
    assert (await gateway.lookup(secret)) is not None
    await admin.revoke("delta")
    await asyncio.sleep(0.35)
    rec = await gateway.lookup(secret)
    assert rec is not None and rec.revoked


def test_names_and_malformed_keys() -> None:
    assert check_name("acme-prod.1") == "acme-prod.1"
    for bad in ("", "Acme", "a b", "x" * 65, "anonymous", "settings", "other", "-x"):
        with pytest.raises(KeyProblem):
            check_name(bad)
    assert well_formed("osk_abc")
    assert not well_formed("") and not well_formed("k\n") and not well_formed("ké")
    assert not well_formed("k" * 257)
