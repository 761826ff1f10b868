"""``streaming.redis_connection``: a gateway's write keeps its timeout, in the caller's task; a
worker's pipeline goes out in one system call (``GathersWrites``).

Against real Redis servers: the run's, and a private one frozen with SIGSTOP so that a large
write really blocks on a full socket buffer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
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
from streaming.redis_connection import (
    GathersWrites,
    TimedWrites,
    gateway_client,
    gathered,
    tuned,
    worker_client,
)
from tests.support.redis_sentinel import SentinelSet
from tests.support.services import running

AUDIO = os.urandom(96_000).hex().encode()[:128_000]  # a 1 s audio event's size


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


async def test_a_timed_write_to_a_frozen_redis_times_out_and_the_next_command_reconnects() -> None:
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


def test_a_sentinel_managed_connection_closed_under_it_is_opened_again() -> None:
    """The same through Sentinel: redis-py's Sentinel-managed connection opens again only once
    its reader is let go of, and a connection read as dropped kept it (its ``disconnect``
    returned early), so every command after a primary's death met ``Buffer is closed``."""

    async def main(url: str) -> None:
        client = gateway_client(url, max_connections=1)
        try:
            await client.ping()
            pool = client.connection_pool
            conn = await pool.get_connection()
            assert conn._writer is not None
            conn._writer.transport.abort()  # as the kernel closes one to a dead primary
            await asyncio.sleep(0.01)
            await conn.disconnect(nowait=True)  # as a failed read does
            await pool.release(conn)
            assert await client.ping()  # the one connection, opened again
            assert await client.set("sentinel-reopens", b"1")
            await client.delete("sentinel-reopens")
        finally:
            await client.aclose()

    with running(SentinelSet()) as sentinels:
        uvloop.run(main(sentinels.url))


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


class CountingSocket:
    """A connected socket that counts the calls that write to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.writes: list[str] = []

    def sendall(self, data: Any, *args: Any) -> None:
        self.writes.append("sendall")
        self.sock.sendall(data, *args)

    def sendmsg(self, buffers: Any, *args: Any) -> int:
        self.writes.append("sendmsg")
        return self.sock.sendmsg(buffers, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def test_a_workers_pipeline_goes_out_in_one_system_call(redis_server: str) -> None:
    client = worker_client(redis_server, max_connections=4)
    listener = redis.Redis.from_url(redis_server)
    pubsub = listener.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("gathered:ch")
    conn = client.connection_pool.get_connection()
    real = None
    try:
        assert isinstance(conn, GathersWrites)
        conn.connect()
        real = conn._sock
        assert real is not None
        counting = CountingSocket(real)
        conn._sock = counting  # type: ignore[assignment]
        commands = [
            ("PUBLISH", "gathered:ch", b"text"),
            ("XADD", "gathered:log", "1-1", "e", b"text"),
            ("PUBLISH", "gathered:ch", AUDIO),
            ("XADD", "gathered:log", "2-1", "e", AUDIO),
        ]
        packed = conn.pack_commands(commands)
        assert len(packed) > 2  # redis-py's pieces: the small commands, each large value alone
        conn.send_packed_command(packed)
        replies = [conn.read_response() for _ in commands]
        assert counting.writes == ["sendmsg"]
        assert replies[1] == b"1-1" and replies[3] == b"2-1"
        published: list[bytes] = []
        deadline = time.monotonic() + 5
        while len(published) < 2 and time.monotonic() < deadline:
            msg = pubsub.get_message(timeout=1.0)
            if msg is not None:
                published.append(msg["data"])
        assert published == [b"text", AUDIO]
        logged = client.xrange("gathered:log")
        assert [fields[b"e"] for _, fields in logged] == [b"text", AUDIO]
    finally:
        if real is not None:
            conn._sock = real
        client.connection_pool.release(conn)
        client.delete("gathered:log")
        pubsub.close()
        listener.close()
        client.close()


def test_writes_larger_than_the_socket_buffers_arrive_whole(redis_server: str) -> None:
    """Partial sends (the socket has a timeout, so each ``sendmsg`` writes what fits) and more
    pieces than one call takes (``MAX_PIECES``)."""
    client = worker_client(redis_server, max_connections=2)
    values = {f"gathered:k{i}": os.urandom(7_000) for i in range(700)}  # a piece each
    values.update({f"gathered:big{i}": os.urandom(3 << 20) for i in range(3)})
    try:
        with client.pipeline(transaction=False) as pipe:
            for key, value in values.items():
                pipe.set(key, value)
            assert all(pipe.execute())
        assert client.mget(list(values)) == list(values.values())
        assert client.ping()
    finally:
        client.delete(*values)
        client.close()


def test_a_gathered_write_to_a_frozen_redis_times_out_and_the_next_command_reconnects() -> None:
    server = start_embedded()
    pool = gathered(redis.ConnectionPool.from_url(server.url, socket_timeout=0.5))
    client = redis.Redis(connection_pool=pool)
    try:
        assert client.ping()  # connected before the freeze
        os.killpg(server.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RedisTimeoutError):
                # far more than the socket buffers hold: the write itself has to wait
                client.set("gathered:huge", b"x" * (64 << 20))
        finally:
            os.killpg(server.process.pid, signal.SIGCONT)
        assert client.ping()  # a new connection: the interrupted one was dropped
        assert client.get("gathered:huge") is None
    finally:
        client.close()
        server.stop()


def test_tcp_and_unix_connections_gather_and_tls_keeps_redis_pys_writes() -> None:
    for url, base, gathers in (
        ("redis://127.0.0.1:1/0", redis.Connection, True),
        ("unix:///tmp/omniserve-none.sock", redis.UnixDomainSocketConnection, True),
        ("rediss://127.0.0.1:1/0", redis.SSLConnection, False),  # (no sendmsg on TLS sockets)
    ):
        pool = gathered(redis.ConnectionPool.from_url(url))
        assert issubclass(pool.connection_class, base)
        assert issubclass(pool.connection_class, GathersWrites) is gathers
        assert gathered(pool).connection_class is pool.connection_class  # applied once
    beat = worker_client("redis://127.0.0.1:1/0", None)  # the heartbeat's own client
    assert issubclass(beat.connection_pool.connection_class, GathersWrites)
