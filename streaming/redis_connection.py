"""redis-py's connections as omniserve opens them (the gateway's, a worker's, and the options of
its Celery consumer's): dead peers found by TCP itself, and the socket timeout of an asyncio write
kept without a task.

A Redis host that goes dark, or a network that drops packets, leaves every open connection
waiting: no reset comes. A command times out (``socket_timeout``), but a connection that only
reads (the gateway's pub/sub, a pooled one at rest, a Celery consumer's ``BRPOP``) waits on, and
once the network heals, TCP's retransmission backoff keeps it silent long after, the longer
the cut the longer the silence (a worker's consumer meanwhile fails every session handed to it:
``tests/faults/test_dropped_packets.py``). ``TCP_OPTIONS`` has the kernel probe a silent
connection and drop one nothing acknowledges for ``DEAD_PEER_S``; a Redis that is merely stalled
(a long fork, SIGSTOP) still has its kernel acknowledge, and is waited for. redis-py
does not see such a drop for what it is: the reader's error is ``ETIMEDOUT``, which it takes for
a read timeout (a pub/sub read then returns nothing, again and again, until its next health
check), and the next write raises uvloop's ``RuntimeError`` (no retry). ``ReopensDropped`` has a
connection whose transport the kernel closed read as not connected, so redis-py opens a new one
(and a pub/sub subscribes again).

redis-py applies ``socket_timeout`` to each command it writes with ``asyncio.wait_for``. Under
Python 3.11 ``wait_for`` runs the write in a task of its own: a task, its scheduling and its
wake-up for every command, when the write almost never waits at all (``drain`` returns at once
unless the socket's buffer is full). On the gateway, whose every chunk of input is a command,
that is a measurable share of its CPU (docs/BENCHMARKS.md). ``TimedWrites`` keeps the same limit
with ``asyncio.timeout`` around the write instead: one timer in the caller's own task. A timeout
does what redis-py's does: the connection is dropped and redis-py's ``TimeoutError`` raised.

Every connection opened (and every one idle past ``health_check_interval``) is checked with a
``PING`` first. A Redis refusing writes because an RDB save failed (``MISCONF``: its disk full)
refuses ``PING`` too, so each new connection would fail before its command, reads included: a
chat turn whose worker opened one would end in ``inference_error`` where it should wait for
Redis (``tests/faults/test_redis_full.py``). That answer proves the connection alive;
``RefusalIsAlive`` (and ``AsyncRefusalIsAlive``) let the check pass on it, and the command
itself meets the refusal, or not, as a read.

A worker's synchronous connections write a pipeline with one ``sendmsg`` (``GathersWrites``):
redis-py's ``sendall`` per piece (the small commands, then each 128 KB audio value on its own)
gives up and takes back the GIL around every piece, and in a worker of many session threads each
taking back waits its turn, so a step's audio reaches Redis well after its text
(docs/BENCHMARKS.md, "the worker's side of the relay").
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

from streaming.redis_url import async_cluster, async_pool, cluster_target, sync_cluster, sync_pool

DEAD_PEER_S = 10  # a connection nothing acknowledges for this long is dropped


def _tcp_options() -> dict[int, int]:
    """Keepalive probes from 3 s of silence on, every second; TCP_USER_TIMEOUT bounds both the
    probes and unacknowledged writes (Linux; elsewhere the options it lacks are left out)."""
    wanted = {
        "TCP_KEEPIDLE": 3,
        "TCP_KEEPINTVL": 1,
        "TCP_KEEPCNT": DEAD_PEER_S,
        "TCP_USER_TIMEOUT": DEAD_PEER_S * 1000,
    }
    return {getattr(socket, n): v for n, v in wanted.items() if hasattr(socket, n)}


TCP_OPTIONS: dict[str, Any] = {
    "socket_keepalive": True,
    "socket_keepalive_options": _tcp_options(),
    "socket_connect_timeout": 5,
}


class ReopensDropped:
    """Mixin for a redis-py asyncio ``Connection`` class: a connection whose transport was
    closed under it (the kernel dropped a dead peer) is not connected (see the module
    docstring)."""

    _reader: asyncio.StreamReader | None
    _writer: asyncio.StreamWriter | None

    @property
    def is_connected(self) -> bool:
        writer = self._writer
        return self._reader is not None and writer is not None and not writer.is_closing()

    async def disconnect(self, *args: Any, **kwargs: Any) -> None:
        """redis-py's; then the streams of a connection read as dropped here are let go of
        too (redis-py returns early for a connection that is not connected). A Sentinel-managed
        connection takes a reader it still holds for connected
        (``SentinelManagedConnection._connect_retry``): kept, it would never open again, and
        every command on it would meet a closed parser (``Buffer is closed``) past a failover's
        promotion."""
        try:
            await super().disconnect(*args, **kwargs)  # type: ignore[misc]
        finally:
            writer = self._writer
            if writer is not None and writer.is_closing():
                self._reader = self._writer = None


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


def _refused_writes(exc: ResponseError) -> bool:
    """Whether an error reply is Redis refusing writes after a failed RDB save (``MISCONF``)."""
    return str(exc).startswith("MISCONF")


class RefusalIsAlive:
    """Mixin for a redis-py synchronous connection: a health-check ``PING`` answered with
    ``MISCONF`` passes (the server answered; see the module docstring)."""

    def check_health(self) -> None:
        try:
            super().check_health()  # type: ignore[misc]
        except ResponseError as exc:
            if not _refused_writes(exc):
                raise


class AsyncRefusalIsAlive:
    """``RefusalIsAlive`` for a redis-py asyncio connection."""

    async def check_health(self) -> None:
        try:
            await super().check_health()  # type: ignore[misc]
        except ResponseError as exc:
            if not _refused_writes(exc):
                raise


class GathersWrites:
    """Mixin for a redis-py synchronous ``Connection`` class: a command packed in several pieces
    goes out in one ``sendmsg`` (see the module docstring); errors as redis-py raises them."""

    _sock: socket.socket | None
    MAX_PIECES = 512  # per call, under the kernel's IOV_MAX (1024)

    def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        if isinstance(command, bytes | str):
            super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        # (nothing to send: redis-py connects and checks the connection's health, as it does
        # before any command)
        super().send_packed_command([], check_health)  # type: ignore[misc]
        pieces = [memoryview(piece) for piece in command]
        sock = self._sock
        assert sock is not None
        first = 0  # the first piece not wholly sent
        try:
            while first < len(pieces):
                sent = sock.sendmsg(pieces[first : first + self.MAX_PIECES])
                while first < len(pieces) and sent >= len(pieces[first]):
                    sent -= len(pieces[first])
                    first += 1
                if sent:
                    pieces[first] = pieces[first][sent:]
        except TimeoutError:  # (socket.timeout)
            self.disconnect()  # type: ignore[attr-defined]
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            self.disconnect()  # type: ignore[attr-defined]
            raise redis.ConnectionError(
                f"Error {exc.errno} while writing to socket. {exc}."
            ) from exc
        except BaseException:  # an interrupted write leaves the stream unusable
            self.disconnect()  # type: ignore[attr-defined]
            raise


def _gathered_class(base: Any) -> Any:
    """``base`` (a synchronous connection class) with ``GathersWrites`` (TCP and Unix
    sockets; a TLS socket has no ``sendmsg`` and keeps redis-py's writes) and
    ``RefusalIsAlive`` (all)."""
    if issubclass(base, RefusalIsAlive):
        return base
    mixins: tuple[type, ...] = (RefusalIsAlive,)
    if not issubclass(base, redis.SSLConnection):
        mixins += (GathersWrites,)
    return type(f"Gathered{base.__name__}", (*mixins, base), {})


def _tuned_class(base: Any) -> Any:
    """``base`` (an asyncio connection class) with ``TimedWrites``, ``ReopensDropped`` and
    ``AsyncRefusalIsAlive``."""
    if issubclass(base, TimedWrites):
        return base
    return type(
        f"Tuned{base.__name__}", (TimedWrites, ReopensDropped, AsyncRefusalIsAlive, base), {}
    )


def gathered(pool: redis.ConnectionPool) -> redis.ConnectionPool:
    """Make ``pool`` open its connections with ``_gathered_class``; returns the pool."""
    pool.connection_class = _gathered_class(pool.connection_class)
    return pool


def tuned(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """Make ``pool`` open its connections with ``_tuned_class``, whatever class the URL chose
    (TCP, TLS or a Unix socket); returns the pool."""
    pool.connection_class = _tuned_class(pool.connection_class)
    return pool


def tuned_cluster(shards: Any) -> Any:
    """Make an asyncio cluster client open every node's connections with ``_tuned_class``.
    redis-py's asyncio cluster client takes no connection class, but opens each node it
    learns of with the options it keeps in ``connection_kwargs`` (its ``connection_class``
    among them), and the nodes it starts from are already made: both are set here."""
    tuned_class = _tuned_class(
        shards.connection_kwargs.get("connection_class", aioredis.Connection)
    )
    shards.connection_kwargs["connection_class"] = tuned_class
    for node in shards.startup_nodes:
        node.connection_class = tuned_class
    return shards


def gathered_cluster(nodes: Any) -> Any:
    """Make a synchronous cluster client's node pools open their connections with
    ``_gathered_class``: the nodes it knows now (their pools' connections so far are let go)
    and those it learns of later (a promoted replica, a node added). Its nodes are
    ``redis.Redis`` clients that take no connection class: each is tuned as it is made."""
    manager = nodes.nodes_manager
    make = manager.create_redis_node

    def create_redis_node(host: str, port: int, **options: Any) -> redis.Redis:
        node: redis.Redis = make(host, port, **options)
        gathered(node.connection_pool)
        return node

    manager.create_redis_node = create_redis_node
    for node in manager.nodes_cache.values():
        if node.redis_connection is not None:
            pool = node.redis_connection.connection_pool
            gathered(pool)
            pool.reset()
    return nodes


def gateway_client(url: str, max_connections: int) -> aioredis.Redis:
    """The gateway's command client (``bench.input_path`` measures against the same one).

    A blocking pool: a burst of commands waits for a connection instead of failing. Retries:
    after Redis restarts, each pooled connection still holds the dead server's socket and fails
    at its next use ("Connection closed by server"); redis-py's pools retry nothing unless told,
    so a client admitted just after the restart would be refused. Two retries on a fresh connection
    serve such a command; a Redis that is really away still fails within a fraction of a second.
    Its writes keep their timeout without a task per command, and a dead peer is found by TCP
    and reopened (``tuned``, ``TCP_OPTIONS``). The URL's own options (``?socket_timeout=``) win.
    On a Redis Cluster (``redis+cluster://``): redis-py's asyncio cluster client, with the same
    timeouts, retries and TCP options, ``max_connections`` per node, and its connections
    tuned the same way (``tuned_cluster``).
    """
    target = cluster_target(url)
    if target is not None:
        shards: Any = async_cluster(
            target,
            max_connections=max_connections,
            health_check_interval=30,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
            socket_timeout=5,
            **TCP_OPTIONS,
        )
        return cast("aioredis.Redis", tuned_cluster(shards))  # (it answers the same commands)
    pool = async_pool(
        url,
        max_connections=max_connections,
        timeout=20,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
        socket_timeout=5,  # (set, not left to redis-py's default, which depends on its version)
        **TCP_OPTIONS,
    )
    client = aioredis.Redis(connection_pool=tuned(pool))
    client.auto_close_connection_pool = True
    return client


def worker_client(url: str, max_connections: int | None) -> redis.Redis:
    """A worker's synchronous client: with ``max_connections``, a blocking pool its session
    threads share (each may hold a connection in ``XREAD BLOCK``); without, the heartbeat's own
    (a busy pool never starves it; redis-py's default retries). Socket timeouts: a Redis that
    vanished mid-command never hangs a thread for good. The pool retries a command on a fresh
    connection after a connection error (a timeout still reaches the caller at once, which
    waits out a stalled Redis its own way): a pooled connection the kernel dropped during a
    partition (``TCP_OPTIONS``) failed the first command after the heal, its health-check
    ``PING`` (``EPIPE``), and with it the claim of the first session given to the worker.
    A pipeline goes out in one system call (``GathersWrites``). On a Redis Cluster: redis-py's
    synchronous cluster client with the same timeouts, ``max_connections`` per node, and its
    pipelines gathered the same way (``gathered_cluster``).
    """
    target = cluster_target(url)
    if target is not None:
        limits: dict[str, Any] = (
            {} if max_connections is None else {"max_connections": max_connections}
        )
        timeout = 5 if max_connections is None else 10
        # redis-py's cluster default backs off for seconds between tries (a node refusing
        # connections while its replica is promoted): the heartbeat would be late for the
        # leases of every shard. Short tries, as the gateway's; the callers wait out the rest.
        quick = SyncRetry(ExponentialBackoff(cap=0.2, base=0.02), retries=2)
        nodes: Any = sync_cluster(
            target, socket_timeout=timeout, retry=quick, **TCP_OPTIONS, **limits
        )
        return cast("redis.Redis", gathered_cluster(nodes))
    if max_connections is None:
        own = sync_pool(
            url,
            blocking=False,
            health_check_interval=30,
            socket_timeout=5,
            **{**TCP_OPTIONS, "socket_connect_timeout": 2},
        )
        return redis.Redis(connection_pool=gathered(own))
    retry = SyncRetry(
        ExponentialBackoff(cap=0.2, base=0.02), retries=2, supported_errors=(redis.ConnectionError,)
    )
    pool = sync_pool(
        url,
        blocking=True,
        max_connections=max_connections,
        timeout=20,
        health_check_interval=30,
        socket_timeout=10,  # longer than any XREAD BLOCK (250 ms)
        retry=retry,
        **TCP_OPTIONS,
    )
    return redis.Redis(connection_pool=gathered(pool))


def unblocked(exc: ResponseError) -> bool:
    """Whether Redis ended a blocking read (``XREAD BLOCK``) without an answer because its role
    changed (a primary made a replica: Sentinel, ``REPLICAOF``): nothing was read, and the read
    may simply be made again (it is then refused or served as any other command)."""
    return str(exc).startswith("UNBLOCKED")
