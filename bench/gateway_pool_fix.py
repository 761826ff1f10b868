"""The gateway with one change, to measure a proposed fix: a blocking Redis connection pool.

redis-py 8's asyncio ConnectionPool caps at 100 connections and raises MaxConnectionsError when
more commands are in flight (api/gateway.py builds its client with ``Redis.from_url`` defaults).
This wrapper makes ``redis.asyncio.Redis.from_url`` use a BlockingConnectionPool (callers wait
for a free connection) and then runs ``omniserve gateway`` unchanged.

    python -m bench.gateway_pool_fix --host 127.0.0.1 --port PORT
"""

from __future__ import annotations

import sys
from typing import Any

import redis.asyncio as aioredis

def _from_url(cls: type, url: str, **kwargs: Any) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=200, timeout=20,
                                                    **kwargs)
    client = cls(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


aioredis.Redis.from_url = classmethod(_from_url)  # type: ignore[method-assign]

if __name__ == "__main__":
    from omniserve.cli import main

    raise SystemExit(main(["gateway", *sys.argv[1:]]))
