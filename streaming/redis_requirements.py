"""What omniserve needs of its Redis server, checked against the server it is given.

A Redis that does not meet them works at first and fails later, silently: an evicting
``maxmemory-policy`` (the default of several managed services) drops a queue, lease or stream key
once memory fills, and admission or delivery breaks without an error; Redis older than 6.2 lacks
commands the scripts use; a server in cluster mode given as one server (not as
``redis+cluster://``) refuses the keys of other shards; a cluster older than 7 lacks sharded
pub/sub; a replica takes no write. The gateway reads ``INFO`` (rarely disabled, unlike
``CONFIG``) once Redis answers and then every minute (on a cluster, each primary's), logs each
unmet requirement and lists it on ``/health``.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from streaming.redis_url import is_cluster

MIN_VERSION = (6, 2)  # LPOS, GETDEL
MIN_CLUSTER_VERSION = (7, 0)  # SPUBLISH, SSUBSCRIBE


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def unmet(info: dict[str, Any], cluster: bool = False) -> list[str]:
    """The requirements ``INFO`` (all sections, as redis-py parses it) shows unmet, as notes;
    ``cluster``: ``INFO`` of a primary of the Redis Cluster omniserve was given."""
    notes: list[str] = []
    version = str(info.get("redis_version", ""))
    if version and _version(version) < MIN_VERSION:
        notes.append(f"Redis {version} is older than 6.2: some commands omniserve sends fail")
    elif cluster and version and _version(version) < MIN_CLUSTER_VERSION:
        notes.append(f"Redis {version} is older than 7.0: it has no sharded pub/sub")
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        notes.append(
            f"Redis maxmemory-policy is {policy}, not noeviction: once its memory fills, Redis "
            "drops queue, lease and stream keys and sessions break without an error"
        )
    if str(info.get("cluster_enabled", "0")) == "1" and not cluster:
        notes.append(
            "Redis runs in cluster mode: give omniserve the cluster as redis+cluster://HOST:PORT,..."
        )
    if str(info.get("role", "master")) != "master":
        notes.append("Redis is a replica: it takes no write (point omniserve at the primary)")
    return notes


async def check(client: aioredis.Redis) -> list[str]:
    """Read ``INFO`` and return the unmet requirements (raises what the read raises); on a
    cluster client, each primary's, named."""
    if not is_cluster(client):
        info: dict[str, Any] = await client.info("everything")
        return unmet(info)
    shards: Any = client
    per_node: dict[str, dict[str, Any]] = await shards.info(
        "everything", target_nodes=AsyncRedisCluster.PRIMARIES
    )
    if "redis_version" in per_node:  # (a cluster of one primary answers as one server)
        per_node = {"primary": per_node}
    notes: list[str] = []
    for name, info in sorted(per_node.items()):
        notes += [f"{name}: {note}" for note in unmet(info, cluster=True)]
    return notes
