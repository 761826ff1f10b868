"""streaming/redis_requirements.py: what INFO shows of omniserve's Redis requirements."""

from __future__ import annotations

import redis.asyncio as aioredis

from streaming.redis_requirements import check, unmet

GOOD = {
    "redis_version": "7.2.4",
    "maxmemory_policy": "noeviction",
    "cluster_enabled": 0,
    "role": "master",
}


def test_a_server_that_meets_them_has_no_note() -> None:
    assert unmet(GOOD) == []
    assert unmet({"redis_version": "6.2.6"}) == []  # (fields INFO did not give: not judged)


def test_each_unmet_requirement_is_named() -> None:
    assert "older than 6.2" in unmet({**GOOD, "redis_version": "6.0.16"})[0]
    assert (
        "maxmemory-policy is allkeys-lru" in unmet({**GOOD, "maxmemory_policy": "allkeys-lru"})[0]
    )
    assert "redis+cluster://" in unmet({**GOOD, "cluster_enabled": 1})[0]
    assert unmet({**GOOD, "cluster_enabled": 1}, cluster=True) == []
    assert "no sharded pub/sub" in unmet({**GOOD, "redis_version": "6.2.14"}, cluster=True)[0]
    assert "is a replica" in unmet({**GOOD, "role": "slave"})[0]
    assert len(unmet({"redis_version": "5.0.0", "maxmemory_policy": "volatile-lru"})) == 2


async def test_the_suites_redis_meets_them(redis_server: str) -> None:
    client = aioredis.Redis.from_url(redis_server)
    try:
        assert await check(client) == []
    finally:
        await client.aclose()
