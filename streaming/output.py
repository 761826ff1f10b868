"""Per-session output: a pub/sub channel for live delivery plus a capped replay log.

The worker publishes each internal event with a per-session sequence number (1, 2, ...) to the
session's channel and appends it to a Redis Stream whose entry id is ``<seq>-1``. The gateway
delivers events in sequence order; a gap (an event lost on the channel) is filled from the log,
and a gap the log no longer covers is reported as a ``gap`` event, never skipped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import redis.asyncio as aioredis

from omnicore.aio import cancel_and_wait
from streaming.events import BadEvent, Event, Gap, decode_event
from streaming.keys import Keys
from streaming.outage import REDIS_OR_OS_ERRORS
from streaming.redis_url import is_cluster

log = logging.getLogger(__name__)

BUS_FAILING_LOG_S = 5.0  # a bus that cannot read says so again this often
RESUBSCRIBED_REREAD_S = 1.0  # after the bus subscribed again, its sessions read their logs again
REREAD_RETRY_S = 0.2  # a failed read of the log is made again this soon

Deliver = Callable[[Event], Awaitable[bool]]
"""``SessionOutput.direct``: take one in-order event now (True), or decline it (False, having done
nothing) so that it is queued for ``get``."""


async def read_log(
    redis_client: aioredis.Redis, keys: Keys, session_id: str, first: int, last: int | None = None
) -> list[Event]:
    """Events ``first..last`` (inclusive; ``last=None``: to the end) still held by the log.

    An entry that is not a valid event is left out (the reader then reports it as a gap).
    """
    end = "+" if last is None else f"{last}-1"
    entries = cast(
        "list[tuple[bytes, dict[bytes, bytes]]]",
        await redis_client.xrange(keys.output_log(session_id), f"{first}-1", end) or [],
    )
    out: list[Event] = []
    for entry_id, fields in entries:
        try:
            out.append(decode_event(fields[b"e"]))
        except (KeyError, BadEvent):
            log.warning("output log %s: entry %r is not an event", session_id, entry_id)
    return out


class SessionOutput:
    """Gateway side: the ordered event stream of one session, addressed by its id.

    ``after`` is the last sequence number the reader already has (0 for a new session); a reader
    opened later (a resumed session) starts from there and takes the rest from the replay log.
    """

    def __init__(
        self,
        bus: OutputBus,
        session_id: str,
        after: int = 0,
        on_overflow: Callable[[], None] | None = None,
    ) -> None:
        self.bus = bus
        self.session_id = session_id
        self.items: deque[tuple[Event, int]] = deque()  # arrived, not yet taken by ``get``
        self._waiter: asyncio.Future[None] | None = None  # ``get`` waiting (one reader only)
        self.expected = after + 1
        self.gaps = 0
        self.pending_bytes = 0  # encoded size of the events waiting in ``items``
        self.overflowed = False
        self.on_overflow = on_overflow
        self.woken = False  # ``wake`` came while no ``get`` was waiting: the next one returns []
        self.closed = False  # the bus no longer relays it (``OutputBus.close``)
        # set by the relay: the bus hands it the next event itself while ``get`` waits (see
        # ``arrive``)
        self.direct: Deliver | None = None
        self.direct_count = 0  # events ``direct`` took
        self.reread = False  # the bus lost its subscription meanwhile: read the log (``get``)

    async def arrive(self, event: Event, size: int = 0) -> None:
        """An event arrived on the live channel (called by the bus's reader).

        When the reader is waiting in ``get`` (so it holds no earlier event), nothing is queued
        and this is the next event in order, it goes to ``direct`` at once, from the bus's own
        task: the session's task is not woken for it, one task step fewer per event
        (docs/BENCHMARKS.md, "the bus delivers").
        Otherwise, or when ``direct`` declines, it is queued (``push``). A ``direct`` that
        raises is logged and not used again; its event is queued, so that the session's own
        task meets the failure the ordinary way.
        """
        direct = self.direct
        if (
            direct is not None
            and not self.items
            and not self.overflowed
            and event.seq == self.expected
            and self._waiter is not None
            and not self._waiter.done()
        ):
            self.expected = event.seq + 1
            try:
                if await direct(event):
                    self.direct_count += 1
                    return
            except Exception:
                log.exception("session %s: delivering event %d failed", self.session_id, event.seq)
                self.direct = None
            self.expected = event.seq
        self.push(event, size)

    def push(self, event: Event, size: int = 0) -> None:
        """Queue an event for ``get`` (``arrive``'s ordinary path).

        Undelivered output is bounded (``OutputBus.max_events`` / ``max_bytes``): past either
        cap the session's reader is not keeping up, so everything waiting is dropped, nothing
        more is kept, and ``on_overflow`` ends the session (``output_backpressure``).
        """
        if self.overflowed:
            return
        self.items.append((event, size))
        self.pending_bytes += size
        if len(self.items) > self.bus.max_events or self.pending_bytes > self.bus.max_bytes:
            log.warning(
                "session %s: %d undelivered output events (%d bytes) over the cap; dropping them",
                self.session_id,
                len(self.items),
                self.pending_bytes,
            )
            self.overflowed = True
            self.items.clear()
            self.pending_bytes = 0
            if self.on_overflow is not None:
                self.on_overflow()
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def resubscribed(self) -> None:
        """The bus subscribed again after losing its connection (Redis away: a failover, a
        restart): what the worker published meanwhile reached nobody, and a worker that held
        its output through the outage published it before the bus was back. The reader's next
        ``get`` reads the log from the next expected event on."""
        self.reread = True
        self.wake()

    def wake(self) -> None:
        """End the reader's wait now with [] (or its next wait at once): something other than an
        event needs its attention (the client closed, its worker's lease lapsed, ...). A relay
        loop is woken like this instead of looking every half second."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        else:
            self.woken = True

    async def get(self, timeout: float | None = None) -> list[Event]:  # noqa: ASYNC109 - see below
        """Wait up to ``timeout`` for the next event; returns it with any gap before it filled,
        or [] (nothing arrived in time, ``wake`` was called, or what arrived was a copy already
        delivered).

        The wait is a future and a timer that resolves it: asyncio's ``timeout`` around a
        queue's ``get`` cancelled the task and raised ``TimeoutError`` through it each time
        nothing came, a cost paid at every quiet wait (docs/BENCHMARKS.md). The
        timeout covers only the wait, not the log catch-up (a caller's cancel scope around
        that would lose the event already taken).
        """
        if self.reread:
            self.reread = self.woken = False
            try:
                found = await self.catch_up()
            except REDIS_OR_OS_ERRORS as exc:  # (a pooled connection of the outage)
                log.warning(
                    "session %s: reading the log failed (%s); again soon", self.session_id, exc
                )
                asyncio.get_running_loop().call_later(REREAD_RETRY_S, self.resubscribed)
                found = []
            if found:
                return found
        if not self.items:
            if self.woken:
                self.woken = False
                return []
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _resolve, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            if not self.items:
                return []
        event, size = self.items.popleft()
        self.pending_bytes = max(0, self.pending_bytes - size)
        return await self._order(event, size)

    async def _order(self, event: Event, size: int = 0) -> list[Event]:
        seq = event.seq
        if seq < self.expected:
            return []  # already delivered (a replay overlapped the live channel)
        out: list[Event] = []
        if seq > self.expected:
            try:
                out.extend(await self.catch_up(seq - 1))
            except REDIS_OR_OS_ERRORS as exc:  # Redis away: the gap is filled once it answers
                log.warning(
                    "session %s: filling events %d..%d from the log failed (%s); again soon",
                    self.session_id,
                    self.expected,
                    seq - 1,
                    exc,
                )
                self.items.appendleft((event, size))
                self.pending_bytes += size
                await asyncio.sleep(REREAD_RETRY_S)
                return []
        if seq >= self.expected:
            out.append(event)
            self.expected = seq + 1
        return out

    async def catch_up(self, upto: int | None = None) -> list[Event]:
        """Events from the next expected one up to ``upto`` (or the log's end), from the log."""
        first = self.expected
        found = await read_log(self.bus.redis, self.bus.keys, self.session_id, first, upto)
        out: list[Event] = []
        for ev in found:
            s = ev.seq
            if s < self.expected:
                continue
            if s > self.expected:
                out.append(self._gap(self.expected, s - 1))
            out.append(ev)
            self.expected = s + 1
        if upto is not None and self.expected <= upto:
            out.append(self._gap(self.expected, upto))
            self.expected = upto + 1
        return out

    def _gap(self, first: int, last: int) -> Gap:
        self.gaps += last - first + 1
        log.warning("session %s lost output events %d..%d", self.session_id, first, last)
        return Gap(first=first, last=last)


def _resolve(waiter: asyncio.Future[None]) -> None:
    """``SessionOutput.get``'s timer: end the wait (with nothing, unless an event came)."""
    if not waiter.done():
        waiter.set_result(None)


async def _pass_push(response: object) -> object:
    """A pub/sub push message, handed back as it came (see ``OutputBus``)."""
    return response


class OutputBus:
    """One pub/sub connection per gateway process, shared by every session it relays.

    Also carries the queue-event channel, handed to ``on_queue_event``. On a Redis Cluster a
    session's channel is a sharded one (``SSUBSCRIBE``: it lives on the shard of the session's
    slot, where a classic channel's messages go to every node): redis-py's cluster pub/sub keeps
    one connection per shard that has a channel of this gateway's, each read by a task of its
    own (``_shard_reader``); the queue events stay a classic channel, read on one node (a
    ``PUBLISH`` reaches every node of a cluster).

    A shard failed over (its replica promoted) or a slot moved: redis-py's cluster pub/sub
    subscribes the channels again on the node that owns their slot now, once the client reads
    the slot map again (it does after a command meets a lost connection or a ``MOVED``: the
    sessions of that shard read their logs, the liveness read asks every shard). A refresh of
    our own is not asked for: it would hold every command of the gateway while it tried a node
    cut off from it first. The queue channel's connection keeps to the node it was opened on,
    and that node may be gone for good: a failing one is dropped and opened again, on the node
    that owns the admission slot by then.
    """

    def __init__(
        self,
        redis_client: aioredis.Redis,
        keys: Keys,
        on_queue_event: Callable[[str], None] | None = None,
        max_events: int = 1000,
        max_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.redis = redis_client
        self.keys = keys
        self.max_events = max_events  # undelivered output of one session (see SessionOutput)
        self.max_bytes = max_bytes
        self.on_queue_event = on_queue_event
        self.sharded = is_cluster(redis_client)
        # Our own push handler: redis-py's default (RESP3) one builds ``str(message)`` for a
        # debug log line on every message, even with debug logging off; for a 128 KB audio
        # event that repr was the largest single cost of the gateway (docs/BENCHMARKS.md).
        self.pubsub = self._new_pubsub()
        self.queue_pubsub = self._new_pubsub() if self.sharded else self.pubsub
        self.sessions: dict[str, SessionOutput] = {}
        self._task: asyncio.Task[None] | None = None
        self._shard_tasks: dict[str, asyncio.Task[None]] = {}  # node name -> its reader
        self._queue_subscribed = False
        # held by each subscribe: the first one opens the connection, and two at once would
        # open two, one of them read by nobody (a gateway started while Redis was away)
        self._first_subscribe = asyncio.Lock()
        self.messages = 0

    def _new_pubsub(self) -> Any:
        return self.redis.pubsub(ignore_subscribe_messages=True, push_handler_func=_pass_push)

    async def _reopen_queue_channel(self) -> None:
        """The queue channel's connection failed on a cluster: open a new one, on the node
        that owns the admission slot by then (see the class docstring)."""
        async with self._first_subscribe:
            old, self.queue_pubsub = self.queue_pubsub, self._new_pubsub()
            self._queue_subscribed = False
        with contextlib.suppress(Exception):
            await old.aclose()

    async def start(self) -> None:
        """Subscribe to the queue channel and start the reader (which subscribes once Redis
        answers, when it does not now)."""
        try:
            await self._subscribe_queue()
        except REDIS_OR_OS_ERRORS as exc:
            log.warning("output bus: no subscription yet (%s); retrying", exc)
        self._task = asyncio.create_task(self._reader(), name="output-bus")

    async def _subscribe_queue(self) -> None:
        # redis-py subscribes again on each reconnection, to the channels once subscribed;
        # a first subscribe that failed left none (nor a connection to read from)
        async with self._first_subscribe:
            if not self._queue_subscribed:
                if self.sharded:  # (the cluster pub/sub needs the slot map the client reads)
                    await self.redis.initialize()
                await self.queue_pubsub.subscribe(self.keys.queue_events)
                self._queue_subscribed = True

    async def stop(self) -> None:
        """Stop the readers and close the connections."""
        for task in [self._task, *self._shard_tasks.values()]:
            if task:  # (its read has a timeout: a single cancel can be absorbed)
                await cancel_and_wait(task)
        self._shard_tasks.clear()
        await self.pubsub.aclose()
        if self.queue_pubsub is not self.pubsub:
            await self.queue_pubsub.aclose()

    async def open(
        self, session_id: str, after: int = 0, on_overflow: Callable[[], None] | None = None
    ) -> SessionOutput:
        """Subscribe to a session's channel (before its worker can emit anything).

        ``after``: the last sequence number already delivered (see SessionOutput);
        ``on_overflow``: called once when the session's undelivered output passes the caps.
        """
        out = SessionOutput(self, session_id, after, on_overflow)
        channel = self.keys.output_channel(session_id)
        self.sessions[channel] = out
        if self.sharded:
            await self.redis.initialize()  # (once: see above)
            await self.pubsub.ssubscribe(channel)
            self._read_shards()
            return out
        async with self._first_subscribe:
            await self.pubsub.subscribe(channel)
        return out

    async def close(self, session_id: str, reader: SessionOutput | None = None) -> None:
        """Stop relaying a session (``reader``: only if it is still that one's: a connection
        that resumed the session on this gateway may have opened its own meanwhile)."""
        channel = self.keys.output_channel(session_id)
        if reader is not None:
            reader.closed = True
            if self.sessions.get(channel) is not reader:
                return
        gone = self.sessions.pop(channel, None)
        if gone is not None:
            gone.closed = True
        try:
            if self.sharded:
                await self.pubsub.sunsubscribe(channel)
            else:
                await self.pubsub.unsubscribe(channel)
        except REDIS_OR_OS_ERRORS:
            log.debug("unsubscribe %s failed", channel, exc_info=True)

    def _read_shards(self) -> None:
        """A reader task for each shard connection the cluster pub/sub holds now (one opens
        with the first channel of a shard, and moves when a slot does)."""
        mapping: dict[str, object] = getattr(self.pubsub, "node_pubsub_mapping", {})
        for name in mapping:
            task = self._shard_tasks.get(name)
            if task is None or task.done():
                self._shard_tasks[name] = asyncio.create_task(
                    self._shard_reader(name), name=f"output-bus-{name}"
                )

    async def _shard_reader(self, name: str) -> None:
        """Read one shard's sharded channels until the cluster pub/sub drops that shard's
        connection (no channel of this gateway's lives there any more)."""
        shards: Any = self.pubsub

        async def read() -> dict[str, Any] | None:
            node = self.redis.get_node(node_name=name)  # type: ignore[attr-defined]
            if node is None or name not in shards.node_pubsub_mapping:
                raise _ShardGone
            if shards.node_pubsub_mapping[name].connection is None:  # its first SSUBSCRIBE
                await asyncio.sleep(0.05)  # is on its way (the reader started as it began)
                return None
            message: dict[str, Any] | None = await shards.get_sharded_message(
                target_node=node, timeout=1.0
            )
            return message

        try:
            await self._read_messages(read, f"output bus (shard {name})")
        except _ShardGone:
            return

    async def _reader(self) -> None:
        async def read() -> dict[str, Any] | None:
            if not self.sharded:
                if not self._queue_subscribed:
                    await self._subscribe_queue()
                message: dict[str, Any] | None = await self.pubsub.get_message(timeout=1.0)
                return message
            self._read_shards()  # (a slot moved: its channels' new shard)
            try:  # (a subscribe that failed keeps to its node too)
                if not self._queue_subscribed:
                    await self._subscribe_queue()
                message = await self.queue_pubsub.get_message(timeout=1.0)
            except Exception:
                await self._reopen_queue_channel()
                raise
            return message

        await self._read_messages(read, "output bus")

    async def _read_messages(
        self, read: Callable[[], Awaitable[dict[str, Any] | None]], what: str
    ) -> None:
        """Take each message ``read`` returns to its session (or to ``on_queue_event``); a read
        that fails is retried, and once reads go through again every session reads its log."""
        queue_channel = self.keys.queue_events
        failing = False
        failing_since = 0.0
        while True:
            try:
                msg = await read()
            except (asyncio.CancelledError, _ShardGone):
                raise
            except Exception as exc:  # noqa: BLE001 - lost connection: retry; seq finds gaps
                if not failing:  # once per outage, not five times a second
                    log.warning("%s read failed (%s); reconnecting", what, exc)
                    failing_since = time.monotonic()
                elif time.monotonic() - failing_since > BUS_FAILING_LOG_S:
                    log.warning("%s read still fails (%r); reconnecting", what, exc)
                    failing_since = time.monotonic()
                failing = True
                await asyncio.sleep(0.2)
                continue
            if failing:
                log.warning(
                    "%s reads again; %d session(s) read their logs", what, len(self.sessions)
                )
                failing = False
                loop = asyncio.get_running_loop()
                for reader in self.sessions.values():
                    reader.resubscribed()
                    # and once more, for what was published as the subscription was renewed
                    loop.call_later(RESUBSCRIBED_REREAD_S, reader.resubscribed)
            if msg is None or msg.get("type") not in (
                "message",
                b"message",
                "smessage",
                b"smessage",
            ):
                continue
            self.messages += 1
            channel = msg["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else channel
            data = msg["data"]
            if channel == queue_channel:
                if self.on_queue_event:
                    self.on_queue_event(data.decode() if isinstance(data, bytes) else data)
                continue
            out = self.sessions.get(channel)
            if out is None:
                continue
            try:
                event = decode_event(data)
            except BadEvent:
                # left out: the next event's sequence number shows the hole (read from the log)
                log.warning("session %s: a message is not an event", out.session_id)
                continue
            await out.arrive(event, len(data))


class _ShardGone(Exception):
    """A shard reader's connection was dropped by the cluster pub/sub (``_shard_reader``)."""
