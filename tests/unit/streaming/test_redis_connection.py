"""``streaming.redis_connection``: a write keeps its timeout, in the caller's task.

Against real Redis servers: the run's, and a private one frozen with SIGSTOP so that a large
write really blocks on a full socket buffer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
import uvloop
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from omniserve.redis_server import start_embedded
from streaming.redis_connection import TimedWrites, gateway_client, tuned, worker_client


async def _commands(client: aioredis.Redis) -> int:
    """Run a command, a pipeline and a pub/sub round; returns how many tasks were created
    meanwhile to write a command."""
    loop = asyncio.get_running_loop()
    created = 0

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
    ) -> asyncio.Task[Any]:
        nonlocal created
        created += "send_packed_command" in getattr(coro, "__qualname__", "")
        return asyncio.Task(coro, loop=loop, **kw)

    await client.ping()  # connected before counting
    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        await client.set("timed-writes:k", b"v" * 70_000)  # an input chunk's size
        async with client.pipeline(transaction=False) as pipe:
            pipe.get("timed-writes:k").delete("timed-writes:k")
            got, deleted = await pipe.execute()
        pubsub = client.pubsub()
        await pubsub.subscribe("timed-writes:c")
        await client.publish("timed-writes:c", b"m")
        msg = None
        while msg is None or msg["type"] != "message":
            msg = await pubsub.get_message(timeout=1.0)
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    finally:
        loop.set_task_factory(None)
    assert got == b"v" * 70_000 and deleted == 1 and msg["data"] == b"m"
    return created


async def test_commands_are_written_without_a_task_of_their_own(redis_server: str) -> None:
    timed = aioredis.Redis(connection_pool=tuned(aioredis.ConnectionPool.from_url(redis_server)))
    plain = aioredis.Redis.from_url(redis_server)
    try:
        assert await _commands(timed) == 0
        if sys.version_info < (3, 12):  # where wait_for wraps the write in a task
            assert await _commands(plain) > 0  # (so the count above sees them)
    finally:
        await timed.aclose()
        await plain.aclose()


async def test_a_write_to_a_frozen_redis_times_out_and_the_next_command_reconnects() -> None:
    server = start_embedded()
    pool = tuned(aioredis.ConnectionPool.from_url(server.url, socket_timeout=0.5))
    client = aioredis.Redis(connection_pool=pool)
    try:
        await client.ping()  # connected (and its handshake done) before the freeze
        os.killpg(server.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RedisTimeoutError):
                # far more than the socket buffers hold: the write itself has to wait
                await client.set("timed-writes:big", b"x" * (64 << 20))
        finally:
            os.killpg(server.process.pid, signal.SIGCONT)
        assert await client.ping()
        conn = await pool.get_connection()
        try:
            assert isinstance(conn, TimedWrites) and conn.socket_timeout == 0.5  # restored
        finally:
            await pool.release(conn)
    finally:
        await client.aclose()
        server.stop()


def test_the_urls_connection_class_is_kept() -> None:
    for url, base in (
        ("redis://127.0.0.1:1/0", aioredis.Connection),
        ("rediss://127.0.0.1:1/0", aioredis.SSLConnection),
        ("unix:///tmp/omniserve-none.sock", aioredis.UnixDomainSocketConnection),
    ):
        pool = tuned(aioredis.ConnectionPool.from_url(url))
        assert issubclass(pool.connection_class, TimedWrites)
        assert issubclass(pool.connection_class, base)
        assert tuned(pool).connection_class is pool.connection_class  # applied once


def test_a_connection_whose_transport_was_closed_under_it_is_opened_again(
    redis_server: str,
) -> None:
    """As the kernel closes a connection to a dead peer (``TCP_USER_TIMEOUT``, keepalive):
    under uvloop, the gateway's loop, a command on it raised ``RuntimeError`` (no retry), and a
    pub/sub read on it returned nothing until its next health check."""

    async def main() -> None:
        client = gateway_client(redis_server, max_connections=4)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await client.ping()
            await pubsub.subscribe("reopens-dropped")
            pool = client.connection_pool
            conn = await pool.get_connection()
            for dropped in (conn, pubsub.connection):
                assert dropped is not None and dropped._writer is not None
                dropped._writer.transport.abort()  # closed under redis-py, as by the kernel
            await asyncio.sleep(0.01)
            assert not conn.is_connected
            await pool.release(conn)
            assert await client.ping()  # a new connection, where a RuntimeError was
            assert await pubsub.get_message(timeout=0.2) is None  # (it subscribed again)
            await client.publish("reopens-dropped", b"m")
            msg = await pubsub.get_message(timeout=2.0)
            assert msg is not None and msg["data"] == b"m"
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
            await client.aclose()

    uvloop.run(main())


def test_a_connection_opened_while_redis_refuses_writes_still_reads() -> None:
    """An RDB save failed (``MISCONF``: Redis refuses writes, and ``PING`` with them). redis-py
    checks each new connection with a ``PING`` first, so every connection opened meanwhile
    failed, reads included: a chat turn's worker, opening one for its cancellation check, ended
    the turn in ``inference_error`` (tests/faults/test_redis_full.py, a flaky run)."""
    server = start_embedded()
    r = redis.Redis.from_url(server.url)
    try:
        r.set("refusal:key", b"v")
        target = Path(server.workdir) / str(r.config_get("dbfilename")["dbfilename"])
        target.mkdir()  # the save's final rename onto a non-empty directory fails
        (target / "in-the-way").touch()
        r.config_set("save", "3600 1")
        r.bgsave()
        deadline = time.monotonic() + 10
        while r.info("persistence")["rdb_last_bgsave_status"] != "err":
            assert time.monotonic() < deadline, "the save did not fail"
            time.sleep(0.05)
        plain = redis.Redis.from_url(server.url, health_check_interval=30)
        with pytest.raises(ResponseError, match="MISCONF"):
            plain.get("refusal:key")  # the new connection's PING refused: the read never ran
        plain.close()
        for client in (worker_client(server.url, 4), worker_client(server.url, None)):
            assert client.get("refusal:key") == b"v"  # a new connection, its check passed
            with pytest.raises(ResponseError, match="MISCONF"):
                client.set("refusal:key", b"w")  # the write itself still refused
            client.close()

        async def gateway_side() -> None:
            client = gateway_client(server.url, max_connections=4)
            try:
                assert await client.get("refusal:key") == b"v"
                with pytest.raises(ResponseError, match="MISCONF"):
                    await client.set("refusal:key", b"w")
            finally:
                await client.aclose()

        uvloop.run(gateway_side())
        r.config_set("save", "")  # writes taken again
        assert r.set("refusal:key", b"w")
    finally:
        r.close()
        server.stop()
