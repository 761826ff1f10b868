"""The gateway's input commands, pipelined on one Redis connection of their own.

Every client audio chunk is an ``XADD`` of ~64 KB. Sent as a command of the shared client, each
paid redis-py's per-command machinery (a connection taken from the pool under a lock and a
timer, the retry wrapper, observability, the pool's release) and a wake-up of the session's task
for the reply: about twice the gateway CPU per chunk that the same chunk costs queued to a
connection of its own (``python -m bench.input_path``; docs/BENCHMARKS.md).
``InputLink`` is that connection (``omniserve-input-<gateway>`` in ``CLIENT LIST``): a caller
queues its commands and gets a future; the link's reader resolves the futures in the order the
commands went out (Redis answers a connection in order).

The link's own writer task sends what callers queue (all that is queued, in one write), so a
caller never waits: not on the socket (a session cancelled at any point cannot cut a write in
half or make redis-py drop the connection under the other sessions' writes), not on a
connection being opened (commands queued meanwhile go out once it is), and not on Redis.
``send`` is synchronous: a receive loop that waited here while Redis stalled would stop reading
its client's frames, pongs included, and a long stall would drop every client.
Beyond ``max_outbox_bytes`` queued unwritten (Redis not reading), a write fails at once
(``InputBacklogFull``): the caller tells its client, and the next write may go through.

Everything one session sends (its chunks and its controls) goes over the same link, so Redis
takes it in the order it was sent. The connection is redis-py's own (``pool.make_connection()``:
the URL's TLS, authentication and timeouts), opened in the background on first use and again
after it failed. A failure fails every write still waiting for its reply (and those queued for a
connection that could not be opened); an error reply fails only its own write. With a
``socket_timeout`` on the URL, a write not answered within it drops the connection, as a command
of the shared client would time out.

While Redis is away (a Sentinel failover, a restart; ``streaming/outage.py``) for up to
``outage_grace_s``, the link keeps what it has not written yet and opens a connection again and
again; once one opens, the commands go out in their order, so a session's input carries on
across the outage. Only writes already sent on the lost connection fail (Redis may or may not
have taken them: sent again, a chunk could be taken twice).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from streaming.outage import Outage, is_outage

log = logging.getLogger(__name__)

Command = Sequence[EncodableT]
MAX_OUTBOX_BYTES = 16 * 2**20  # ~250 one-second chunks queued unwritten: writes fail beyond it
REOPEN_S = 0.1  # while Redis is away, a connection is tried this often


class InputBacklogFull(RedisConnectionError):
    """Redis has not read what the link queued: the write is refused rather than waited for."""


@dataclass(slots=True)
class _Write:
    """One caller's commands: resolved when the last reply is in, failed by the first error."""

    done: asyncio.Future[None]
    left: int
    sent_at: float
    error: BaseException | None = field(default=None)


class InputLink:
    """One pipelined connection for the gateway's input (see the module docstring)."""

    def __init__(
        self,
        pool: aioredis.ConnectionPool,
        name: str = "omniserve-input",
        max_outbox_bytes: int = MAX_OUTBOX_BYTES,
        outage_grace_s: float = 0.0,
    ) -> None:
        self.pool = pool
        self.name = name  # its CLIENT SETNAME: an operator's CLIENT LIST tells it apart
        self.max_outbox_bytes = max_outbox_bytes
        self._conn: AbstractConnection | None = None
        self._opening: asyncio.Task[None] | None = None  # connecting self._conn
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._pending: collections.deque[_Write] = collections.deque()  # queued or written
        self._outbox: list[bytes] = []  # packed commands the writer has yet to send
        self._outbox_bytes = 0
        self._unsent = 0  # writes at the end of ``_pending`` whose commands are in the outbox
        self.outage = Outage(outage_grace_s)
        self._wake = asyncio.Event()  # the writer has something to send
        self._closed = False

    def send(self, *commands: Command) -> asyncio.Future[None]:
        """Queue ``commands``; the future resolves when Redis has answered all of them, or
        fails (``InputBacklogFull`` at once when the outbox is full). Never waits; raises only
        when the link was closed."""
        if self._closed:
            raise RedisConnectionError("the input link was closed")
        write = _Write(asyncio.get_running_loop().create_future(), len(commands), time.monotonic())
        if self._outbox_bytes >= self.max_outbox_bytes:
            write.error = InputBacklogFull(
                f"Redis has not read the {self._outbox_bytes} bytes of input queued before"
            )
            _resolve(write)
            return write.done
        conn = self._conn
        if conn is None or not self._usable():
            conn = self._open()
        if len(commands) == 1:
            packed = conn.pack_command(*commands[0])
        else:
            packed = conn.pack_commands(commands)
        # registered as it is queued, in the same step: replies come back in this order
        self._pending.append(write)
        self._unsent += 1
        self._outbox += packed
        self._outbox_bytes += sum(len(piece) for piece in packed)
        self._wake.set()
        return write.done

    async def aclose(self) -> None:
        """Close the connection; writes still waiting fail."""
        self._closed = True
        for task in (self._opening, self._reader, self._writer, self._watch):
            if task is not None:
                task.cancel()
        if self._conn is not None:
            await self._conn.disconnect()
        self._fail_all(RedisConnectionError("the input link was closed"))

    # ------------------------------------------------------------------ internals
    def _usable(self) -> bool:
        """A connection that is being opened, or open with its reader and writer running."""
        if self._conn is None:
            return False
        if self._opening is not None and not self._opening.done():
            return True
        return self._conn.is_connected and self._running()

    def _open(self) -> AbstractConnection:
        """Replace the connection: what was sent on the old one and waits for its reply fails;
        the new one is opened in the background, and what is queued (before or meanwhile)
        goes out once it is."""
        for task in (self._opening, self._reader, self._writer):
            if task is not None:
                task.cancel()
        self._reader = self._writer = None
        self._fail_sent(RedisConnectionError("the input connection was lost"))
        old = self._conn
        conn = self._conn = cast(AbstractConnection, self.pool.make_connection())  # type: ignore[no-untyped-call]
        self._opening = asyncio.create_task(self._connect(conn, old), name="input-link-connect")
        limit_s = conn.socket_timeout
        if limit_s and (self._watch is None or self._watch.done()):
            self._watch = asyncio.create_task(self._watch_stale(limit_s), name="input-link-watch")
        return conn

    async def _connect(self, conn: AbstractConnection, old: AbstractConnection | None) -> None:
        if old is not None:
            await old.disconnect(nowait=True)
        while True:
            try:
                await conn.connect()  # type: ignore[no-untyped-call]
                await conn.send_command("CLIENT", "SETNAME", self.name, check_health=False)
                await conn.read_response()
                break
            except asyncio.CancelledError:
                await conn.disconnect(nowait=True)
                raise
            except Exception as exc:  # noqa: BLE001 - Redis unreachable: what was queued fails
                await conn.disconnect(nowait=True)
                began = not self.outage.away
                if is_outage(exc) and self.outage.failed() and self._conn is conn:
                    if began:
                        log.warning("input link: Redis is away (%s); holding the input", exc)
                    await asyncio.sleep(REOPEN_S)  # (what is queued meanwhile waits)
                    continue
                log.warning("input link: connecting to Redis failed: %s", exc)
                if self._conn is conn:
                    self._fail_all(exc)
                return
        lasted = self.outage.answered()
        if lasted is not None:
            log.warning("input link: Redis answers again after %.1f s; held input sent", lasted)
        self._reader = asyncio.create_task(self._read(conn), name="input-link-reader")
        self._writer = asyncio.create_task(self._write(conn), name="input-link-writer")

    def _running(self) -> bool:
        return all(t is not None and not t.done() for t in (self._reader, self._writer))

    async def _write(self, conn: AbstractConnection) -> None:
        """Send everything queued, in one write each time, in the order it was queued."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._outbox, self._outbox_bytes = self._outbox, [], 0
            self._unsent = 0
            if not batch:
                continue
            try:
                await conn.send_packed_command(batch, check_health=False)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - redis-py dropped the connection
                log.warning("input link: writing to Redis failed: %s", exc)
                if self._conn is conn:  # (not a connection already replaced)
                    self._lost(exc)
                return

    async def _read(self, conn: AbstractConnection) -> None:
        """Resolve the waiting writes, in order, as their replies arrive."""
        while True:
            try:
                # no timer per read: an idle link waits as long as it is idle (_watch_stale)
                await conn.read_response(timeout=math.inf)
                error: BaseException | None = None
            except ResponseError as exc:  # an error reply: that command's, the link goes on
                error = exc
            except asyncio.CancelledError:  # closed or replaced: whoever did it fails the rest
                raise
            except Exception as exc:  # noqa: BLE001 - whatever it was, the connection is done
                log.warning("input link to Redis lost: %s", exc)
                await conn.disconnect(nowait=True)
                if self._conn is conn:  # (not a connection already replaced)
                    self._lost(exc)
                return
            if not self._pending:  # a reply nobody waits for: the stream is out of step
                log.error("input link: a reply without a command; reconnecting")
                await conn.disconnect(nowait=True)
                return
            write = self._pending[0]
            write.left -= 1
            write.error = write.error or error
            if write.left == 0:
                self._pending.popleft()
                _resolve(write)

    async def _watch_stale(self, limit_s: float) -> None:
        """Drop the connection when the oldest write waits longer than ``socket_timeout``."""
        while not self._closed:
            await asyncio.sleep(min(1.0, limit_s / 2))
            if self.outage.away:  # reconnecting within the outage grace, which bounds the wait
                continue
            if self._pending and time.monotonic() - self._pending[0].sent_at > limit_s:
                conn, opening, self._opening = self._conn, self._opening, None
                log.warning("input link: no reply from Redis within %.1f s; reconnecting", limit_s)
                if opening is not None:
                    opening.cancel()  # (a connection still being opened is not waited for)
                self._fail_all(RedisTimeoutError("Timeout reading from the input link"))
                if conn is not None:
                    await conn.disconnect(nowait=True)

    def _lost(self, exc: BaseException) -> None:
        """The connection failed: what was sent on it fails; what was not, waits for the next
        one, opened now when Redis may be away (else at the next ``send``)."""
        self._fail_sent(exc)
        if self._pending and is_outage(exc) and not self._closed:
            self._open()

    def _fail_sent(self, exc: BaseException) -> None:
        """Fail the writes already sent (their replies will never come); keep the others,
        unless an outage has lasted past its grace (then all fail)."""
        if self.outage.away and not self.outage.failed():
            self._fail_all(exc)
            return
        while len(self._pending) > self._unsent:
            write = self._pending.popleft()
            write.error = write.error or exc
            _resolve(write)

    def _fail_all(self, exc: BaseException) -> None:
        self._outbox, self._outbox_bytes, self._unsent = [], 0, 0  # (their writes fail below)
        while self._pending:
            write = self._pending.popleft()
            write.error = write.error or exc
            _resolve(write)


def _resolve(write: _Write) -> None:
    if write.done.done():
        return
    if write.error is None:
        write.done.set_result(None)
    else:
        write.done.set_exception(write.error)
