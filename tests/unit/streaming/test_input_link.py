"""streaming/input_link.py against a real Redis: writes in flight at once, answered in order;
an error reply, a killed connection, a Redis that stops answering, frozen or unreachable, and
the link closed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from omniserve.redis_server import EmbeddedRedis, free_port, start_embedded
from streaming.input_link import MAX_OUTBOX_BYTES, InputBacklogFull, InputLink

KEY = "link:test"


async def answered(*writes: asyncio.Future[None]) -> None:
    """Wait for the writes' answers (a link that loses one fails the test, not hangs it)."""
    await asyncio.wait_for(asyncio.gather(*writes), 10)


@pytest.fixture
async def link(async_redis: aioredis.Redis) -> AsyncIterator[InputLink]:
    lk = InputLink(async_redis.connection_pool)
    try:
        yield lk
    finally:
        await lk.aclose()


async def test_writes_in_flight_at_once_are_answered_in_the_order_they_went_out(
    link: InputLink, sync_redis: redis.Redis
) -> None:
    sync_redis.delete(KEY)
    written = [link.send(["XADD", KEY, "*", "n", n]) for n in range(200)]
    assert not all(w.done() for w in written)  # none of them was waited for
    await answered(*written)
    entries = sync_redis.xrange(KEY)
    assert [int(fields[b"n"]) for _, fields in entries] == list(range(200))
    # several commands as one write: one future, resolved when the last reply is in
    both = link.send(["XADD", KEY, "*", "n", 200], ["EXPIRE", KEY, 60])
    await answered(both)
    assert sync_redis.xlen(KEY) == 201 and 0 < sync_redis.ttl(KEY) <= 60


async def test_an_error_reply_fails_only_its_own_write(
    link: InputLink, sync_redis: redis.Redis
) -> None:
    sync_redis.set(KEY, "a string, not a stream")
    before = link.send(["XADD", f"{KEY}:ok", "*", "n", 1])
    wrong = link.send(["XADD", KEY, "*", "n", 1])  # WRONGTYPE
    after = link.send(["XADD", f"{KEY}:ok", "*", "n", 2], ["XADD", KEY, "*", "n", 2])
    await answered(before)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await answered(wrong)
    with pytest.raises(ResponseError, match="WRONGTYPE"):  # its first command went through
        await answered(after)
    assert sync_redis.xlen(f"{KEY}:ok") == 2
    await answered(link.send(["XADD", f"{KEY}:ok", "*", "n", 3]))  # the link goes on
    sync_redis.delete(KEY, f"{KEY}:ok")


async def test_a_killed_connection_fails_the_writes_waiting_and_the_next_write_reconnects(
    link: InputLink, sync_redis: redis.Redis
) -> None:
    await link.send(["CLIENT", "SETNAME", "input-link"])
    sync_redis.client_pause(10_000, all=False)  # writes wait; the link's stay unanswered
    try:
        waiting = [link.send(["XADD", KEY, "*", "n", n]) for n in range(3)]
        await asyncio.sleep(0.2)
        assert not any(w.done() for w in waiting)
        killed = sync_redis.execute_command("CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal")
        assert killed >= 1
        for w in waiting:
            with pytest.raises(RedisConnectionError):
                await asyncio.wait_for(w, 5)
    finally:
        sync_redis.client_unpause()
    sync_redis.delete(KEY)
    await link.send(["XADD", KEY, "*", "n", 9])  # a fresh connection
    assert sync_redis.xlen(KEY) == 1
    sync_redis.delete(KEY)


async def test_a_redis_that_stops_answering_fails_the_write_after_the_socket_timeout(
    redis_server: str, sync_redis: redis.Redis
) -> None:
    client = aioredis.Redis.from_url(redis_server, socket_timeout=0.5)
    link = InputLink(client.connection_pool)
    try:
        await link.send(["PING"])
        sync_redis.client_pause(3_000, all=False)
        try:
            stuck = link.send(["XADD", KEY, "*", "n", 1])
            with pytest.raises(RedisTimeoutError):
                await asyncio.wait_for(stuck, 2.5)  # within about twice the timeout
        finally:
            sync_redis.client_unpause()
        await link.send(["PING"])  # and it reconnects
    finally:
        await link.aclose()
        await client.aclose()
        sync_redis.delete(KEY)


async def test_a_closed_link_fails_what_waits_and_takes_no_more(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    link = InputLink(async_redis.connection_pool)
    sync_redis.client_pause(5_000, all=False)
    try:
        waiting = link.send(["XADD", KEY, "*", "n", 1])
        await link.aclose()
        with pytest.raises(RedisConnectionError):
            await waiting
        with pytest.raises(RedisConnectionError, match="closed"):
            link.send(["PING"])
    finally:
        sync_redis.client_unpause()
        sync_redis.delete(KEY)


@contextlib.asynccontextmanager
async def private_redis(
    name: str, max_outbox_bytes: int = MAX_OUTBOX_BYTES
) -> AsyncIterator[tuple[EmbeddedRedis, InputLink, redis.Redis]]:
    """A Redis of the test's own (to freeze with SIGSTOP), a link to it and a plain client."""
    server = start_embedded()
    client = aioredis.Redis.from_url(server.url)
    link = InputLink(client.connection_pool, name, max_outbox_bytes=max_outbox_bytes)
    sync = redis.Redis.from_url(server.url)
    try:
        yield server, link, sync
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        await link.aclose()
        await client.aclose()
        sync.close()
        server.stop()


async def test_a_frozen_redis_never_holds_a_caller_and_a_full_outbox_refuses_at_once() -> None:
    """Redis frozen (SIGSTOP): 64 KB writes queue until the socket and the outbox are full; the
    next write fails at once (``InputBacklogFull``), nothing waits. Redis thawed, every write
    queued before is answered on the same connection (nothing cut in half, nothing dropped),
    and the link takes writes again. A receive loop waiting here stopped reading its client's
    pongs, so a long stall dropped every client."""
    blob = b"x" * 65536
    async with private_redis("frozen-test", max_outbox_bytes=256 * 1024) as (server, link, sync):
        await answered(link.send(["PING"]))
        (before,) = [c["id"] for c in sync.client_list() if c["name"] == "frozen-test"]
        os.kill(server.process.pid, signal.SIGSTOP)
        written: list[asyncio.Future[None]] = []
        for _ in range(2000):  # (the socket's buffers take a few MB first)
            write = link.send(["XADD", KEY, "*", "n", len(written), "b", blob])
            if write.done():  # refused: the outbox is full
                break
            written.append(write)
            await asyncio.sleep(0.005)  # the writer fills the socket meanwhile
        with pytest.raises(InputBacklogFull):
            write.result()
        assert len(written) > 4 and not any(w.done() for w in written)
        os.kill(server.process.pid, signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(*written), 30)
        assert sync.xlen(KEY) == len(written)
        await answered(link.send(["XADD", KEY, "*", "n", len(written), "b", blob]))
        assert [c["id"] for c in sync.client_list() if c["name"] == "frozen-test"] == [before]


async def test_writes_queued_while_the_connection_opens_go_out_once_it_is_open() -> None:
    """The first write finds Redis frozen: it returns at once, waits for the connection, and is
    answered (after the link's own CLIENT SETNAME) once Redis is thawed."""
    async with private_redis("opening-test") as (server, link, sync):
        os.kill(server.process.pid, signal.SIGSTOP)
        written = [link.send(["XADD", KEY, "*", "n", n]) for n in range(3)]
        await asyncio.sleep(0.5)
        assert not any(w.done() for w in written)
        os.kill(server.process.pid, signal.SIGCONT)
        await answered(*written)
        assert [int(f[b"n"]) for _, f in sync.xrange(KEY)] == [0, 1, 2]
        assert [c["name"] for c in sync.client_list()].count("opening-test") == 1


async def test_a_redis_that_cannot_be_reached_fails_the_writes_queued_for_it() -> None:
    """No Redis at all: the write returns a future that fails (the caller is neither raised at
    nor held); once Redis is there, the next write opens a connection and goes through."""
    port = free_port()
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    link = InputLink(client.connection_pool)
    server = None
    try:
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(link.send(["PING"]), 10)
        server = start_embedded(port)
        await answered(link.send(["PING"]))
    finally:
        await link.aclose()
        await client.aclose()
        if server is not None:
            server.stop()


async def test_with_an_outage_grace_writes_wait_for_a_redis_that_comes_back() -> None:
    """Redis away (killed, started again empty on its port: a restart, a failover's gap) within
    ``outage_grace_s``: writes sent meanwhile are held, in order, and go out once it answers;
    past the grace they fail as without one."""
    port = free_port()
    server = start_embedded(port)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    link = InputLink(client.connection_pool, outage_grace_s=10.0)
    try:
        await answered(link.send(["PING"]))
        server.process.kill()
        server.process.wait(timeout=10)
        server.stop()
        await asyncio.sleep(0.2)  # (the link's reader finds the connection gone)
        written = [link.send(["XADD", KEY, "*", "n", n]) for n in range(5)]
        await asyncio.sleep(1.0)
        assert not any(w.done() for w in written)  # held while Redis is away
        server = start_embedded(port)
        await answered(*written)
        sync = redis.Redis(port=port)
        assert [int(f[b"n"]) for _, f in sync.xrange(KEY)] == list(range(5))
        sync.close()
        assert link.outage.outages == 1 and not link.outage.away
    finally:
        await link.aclose()
        await client.aclose()
        server.stop()
    short = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    gone = InputLink(short.connection_pool, outage_grace_s=0.5)
    try:
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(gone.send(["PING"]), 10)
    finally:
        await gone.aclose()
        await short.aclose()
