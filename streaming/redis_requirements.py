"""What omniserve needs of its Redis server, checked against the server it is given.

A Redis that does not meet them works at first and fails later, silently: an evicting
``maxmemory-policy`` (the default of several managed services) drops a queue, lease or stream key
once memory fills, and admission or delivery breaks without an error; Redis older than 6.2 lacks
commands the scripts use; Redis Cluster cannot run scripts that build key names; a replica takes
no write. The gateway reads ``INFO`` (rarely disabled, unlike ``CONFIG``) once Redis answers and
then every minute, logs each unmet requirement and lists it on ``/health``.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

MIN_VERSION = (6, 2)  # LPOS, GETDEL


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def unmet(info: dict[str, Any]) -> list[str]:
    """The requirements ``INFO`` (all sections, as redis-py parses it) shows unmet, as notes."""
    notes: list[str] = []
    version = str(info.get("redis_version", ""))
    if version and _version(version) < MIN_VERSION:
        notes.append(f"Redis {version} is older than 6.2: some commands omniserve sends fail")
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        notes.append(
            f"Redis maxmemory-policy is {policy}, not noeviction: once its memory fills, Redis "
            "drops queue, lease and stream keys and sessions break without an error"
        )
    if str(info.get("cluster_enabled", "0")) == "1":
        notes.append("Redis runs in cluster mode, which omniserve does not support")
    if str(info.get("role", "master")) != "master":
        notes.append("Redis is a replica: it takes no write (point omniserve at the primary)")
    return notes


async def check(client: aioredis.Redis) -> list[str]:
    """Read ``INFO`` and return the unmet requirements (raises what the read raises)."""
    info: dict[str, Any] = await client.info("everything")
    return unmet(info)
