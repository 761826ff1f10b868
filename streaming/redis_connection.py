"""redis-py's asyncio connections, with the socket timeout of a write kept without a task.

redis-py applies ``socket_timeout`` to each command it writes with ``asyncio.wait_for``. Under
Python 3.11 ``wait_for`` runs the write in a task of its own: a task, its scheduling and its
wake-up for every command, when the write almost never waits at all (``drain`` returns at once
unless the socket's buffer is full). On the gateway, whose every chunk of input is a command,
that was ~3 % of its CPU (docs/BENCHMARKS.md). ``timed_writes`` keeps the same limit with
``asyncio.timeout`` around the write instead: one timer in the caller's own task. What a
timeout does is unchanged: the connection is dropped and redis-py's ``TimeoutError`` raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


class TimedWrites:
    """Mixin for a redis-py asyncio ``Connection`` class (see the module docstring)."""

    socket_timeout: float | None

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        limit = self.socket_timeout
        if not limit:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        # While the write runs, the connection's own timeout is off, so redis-py writes it
        # in this task; the timer below bounds the whole call (a health-check PING included).
        self.socket_timeout = None
        try:
            async with asyncio.timeout(limit):
                await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except TimeoutError:  # (redis-py dropped the connection on the way out)
            raise RedisTimeoutError("Timeout writing to socket") from None
        finally:
            self.socket_timeout = limit


def timed_writes(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """Make ``pool`` open its connections with ``TimedWrites``, whatever class the URL chose
    (TCP, TLS or a Unix socket); returns the pool."""
    base: Any = pool.connection_class
    if not issubclass(base, TimedWrites):
        pool.connection_class = type(f"Timed{base.__name__}", (TimedWrites, base), {})
    return pool


def gateway_client(url: str, max_connections: int) -> aioredis.Redis:
    """The gateway's command client (``bench.input_path`` measures against the same one).

    A blocking pool: a burst of commands waits for a connection instead of failing. Retries:
    after Redis restarts, each pooled connection still holds the dead server's socket and fails
    at its next use ("Connection closed by server"); redis-py's pools retry nothing unless told,
    so a client admitted just after the restart was refused. Two retries on a fresh connection
    serve such a command; a Redis that is really away still fails within a fraction of a second.
    Its writes keep their timeout without a task per command (``timed_writes``).
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=20,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
    )
    client = aioredis.Redis(connection_pool=timed_writes(pool))
    client.auto_close_connection_pool = True
    return client


def unblocked(exc: ResponseError) -> bool:
    """Whether Redis ended a blocking read (``XREAD BLOCK``) without an answer because its role
    changed (a primary made a replica: Sentinel, ``REPLICAOF``): nothing was read, and the read
    may simply be made again (it is then refused or served as any other command)."""
    return str(exc).startswith("UNBLOCKED")
