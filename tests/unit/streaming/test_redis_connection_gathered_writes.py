"""``streaming.redis_connection.GathersWrites``: a worker's pipeline in one system call.

Against real Redis servers: the run's, and a private one frozen with SIGSTOP so that a large
write really blocks on a full socket buffer.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

import pytest
import redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from omniserve.redis_server import start_embedded
from streaming.redis_connection import GathersWrites, gathered, worker_client

AUDIO = os.urandom(96_000).hex().encode()[:128_000]  # a 1 s audio event's size


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


def test_a_write_to_a_frozen_redis_times_out_and_the_next_command_reconnects() -> None:
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
