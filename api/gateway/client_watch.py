"""Clients that stopped keeping up: found within seconds, their work freed, their socket torn down.

One task per gateway process (``ClientWatch``) looks at every connection twice a second for
three signs:

- silence: a duplex client that holds a worker slot must send (audio every second); one that
  sends nothing for ``client_idle_timeout_s`` is ``client_idle``;
- pings: uvicorn pings every ``ws_ping_interval_s`` and fails a peer that has not answered within
  ``ws_ping_timeout_s`` (close 1011): ``ping_timeout``;
- output: the session's undelivered output passed its caps (``streaming/output.py``):
  ``output_backpressure``.

Ending such a client frees its worker first (``ClientSocket.on_evict`` tells the worker to close
the session, so the slot is back within a step), then gives the session ``EVICT_GRACE_S`` to end
the ordinary way (a client that still reads gets ``session.closed`` with the reason), and then
aborts the TCP connection. Without the abort a client that never reads would keep a blocked send,
its socket and its write buffer for ever: asyncio flushes a closing transport before letting it
go, and a peer that answers with a zero TCP window never times out.

(A task and a timer per connection woke the event loop twice a second for every connection,
~2.5 of the ~20 callbacks a duplex session costs the gateway per second: docs/BENCHMARKS.md.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from starlette.websockets import WebSocket

from api.metrics.registry import GatewayMetrics
from omnicore.settings import Settings
from streaming.events import CloseReason

log = logging.getLogger("omniserve.gateway")


class WatchHost(Protocol):
    """What the watch needs of the gateway (``api/gateway/state.py``, which holds the watch)."""

    settings: Settings
    metrics: GatewayMetrics


class Watched(Protocol):
    """What the watch needs of a connection (``api/realtime/connection.py``'s ``ClientSocket``)."""

    @property
    def gateway(self) -> WatchHost: ...

    ws: WebSocket
    log_id: str
    gone: asyncio.Event
    output_overflowed: bool
    evict_reason: CloseReason | None

    def idle_seconds(self) -> float:
        """How long the client has been silent while it owes input (0: it owes none)."""

    async def on_evict(self, reason: CloseReason) -> None:
        """Free the worker the connection holds."""


CHECK_S = 0.5  # how often a connection is looked at (an output overflow: at once)
STALL_S = 1.0  # a look this much later than planned means the event loop was held up
EVICT_GRACE_S = 2.0  # an evicted session may end the ordinary way within this, else abort


def _protocol(ws: WebSocket) -> Any:
    """uvicorn's protocol object of this connection, or None.

    ASGI gives an application no transport, but the ``receive`` callable the server hands in is
    a bound method of its protocol object, and no middleware of ours wraps ``receive``.
    """
    return getattr(getattr(ws, "_receive", None), "__self__", None)


def abort_socket(ws: WebSocket) -> bool:
    """Drop the TCP connection at once, unsent data and all; False when it cannot be reached."""
    abort = getattr(getattr(_protocol(ws), "transport", None), "abort", None)
    if callable(abort):  # (uvloop's transports are not asyncio.Transport subclasses)
        abort()
        return True
    return False


def writable(ws: WebSocket) -> bool:
    """Whether uvicorn would take a frame now without waiting (its flow control: the peer reads
    what it is sent); False when that cannot be told (another server or protocol class)."""
    event = getattr(_protocol(ws), "writable", None)
    return isinstance(event, asyncio.Event) and event.is_set()


def pings_failed(ws: WebSocket) -> bool:
    """Whether uvicorn failed this connection because the peer stopped answering its pings.

    (uvicorn's websockets sans-I/O protocol, its default, fails it with close code 1011 and the
    reason "keepalive ping timeout"; the application then sees an ordinary disconnect.)
    """
    sent = getattr(getattr(_protocol(ws), "conn", None), "close_sent", None)
    return getattr(sent, "code", None) == 1011 and "ping" in str(getattr(sent, "reason", ""))


def idle_seconds(*since: float) -> float:
    """Seconds since the latest of ``since`` (monotonic times: last frame heard, ...)."""
    return time.monotonic() - max(since)


def note(conn: Watched, reason: CloseReason) -> None:
    """The operator's view of a dropped client: one log line and the metric."""
    why = {
        CloseReason.CLIENT_IDLE: (
            f"sent nothing for {conn.gateway.settings.client_idle_timeout_s:g} s"
            " while holding a slot"
        ),
        CloseReason.PING_TIMEOUT: "stopped answering WebSocket pings",
        CloseReason.OUTPUT_BACKPRESSURE: "did not read its output (over the cap)",
    }.get(reason, str(reason))
    log.warning("%s: the client %s; ending the session (%s)", conn.log_id, why, reason)
    conn.gateway.metrics.clients_dropped.labels(str(reason)).inc()


def verdict(conn: Watched, stalled: bool = False) -> CloseReason | None:
    """Why this connection must end now, or None.

    ``stalled``: this process's event loop has just been held up (a long GC pause, the process
    stopped): frames that arrived meanwhile are not read yet, so silence proves nothing now.
    """
    if conn.output_overflowed:
        return CloseReason.OUTPUT_BACKPRESSURE
    if pings_failed(conn.ws):
        return CloseReason.PING_TIMEOUT
    limit = conn.gateway.settings.client_idle_timeout_s
    if limit > 0 and not stalled and conn.idle_seconds() > limit:
        return CloseReason.CLIENT_IDLE
    return None


async def evict(conn: Watched, reason: CloseReason) -> None:
    """End a connection whose client stopped keeping up (see the module docstring)."""
    conn.evict_reason = reason
    note(conn, reason)
    try:
        await conn.on_evict(reason)
    except Exception:  # Redis away: the worker's lease watch ends the session anyway
        log.warning("%s: could not stop its work", conn.log_id, exc_info=True)
    try:
        await asyncio.wait_for(conn.gone.wait(), EVICT_GRACE_S)
    except TimeoutError:
        if not abort_socket(conn.ws):
            log.warning("%s: cannot abort the socket of this server", conn.log_id)
        conn.gone.set()


class ClientWatch:
    """Looks at every connection of this process every ``CHECK_S``, in one task; evicts those
    that ``verdict`` condemns, each in a task of its own."""

    def __init__(self) -> None:
        self._conns: dict[Watched, asyncio.Task[None] | None] = {}  # -> its eviction, if any
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._conns)

    def add(self, conn: Watched) -> None:
        """Watch ``conn`` until ``forget``."""
        self._conns[conn] = None
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._sweep(), name="client-watch")

    def look_now(self, conn: Watched) -> None:
        """Look at ``conn`` at once, not at the next sweep (its output just overflowed)."""
        asyncio.get_running_loop().call_soon(self._look, conn, False)

    async def forget(self, conn: Watched) -> None:
        """``conn`` ended (its ``gone`` is set): let an eviction under way finish, stop
        watching it, and name a ping timeout that uvicorn found by itself."""
        evicting = self._conns.get(conn)
        if evicting is not None:
            await asyncio.gather(evicting, return_exceptions=True)
        self._conns.pop(conn, None)
        if conn.evict_reason is None and pings_failed(conn.ws):
            conn.evict_reason = CloseReason.PING_TIMEOUT  # uvicorn closed it already: say so
            note(conn, CloseReason.PING_TIMEOUT)

    def drop(self, conn: Watched) -> None:
        """Stop watching ``conn`` now, cancelling an eviction under way (``forget`` was cut
        short: the connection's own task was cancelled)."""
        evicting = self._conns.pop(conn, None)
        if evicting is not None:
            evicting.cancel()

    async def stop(self) -> None:
        """Stop the sweep and any eviction under way (the gateway is stopping)."""
        tasks = [t for t in (self._task, *self._conns.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _sweep(self) -> None:
        while self._conns:  # (ends with the last connection; ``add`` starts it again)
            looked = time.monotonic()
            await asyncio.sleep(CHECK_S)
            stalled = time.monotonic() - looked > CHECK_S + STALL_S
            for conn in list(self._conns):
                self._look(conn, stalled)

    def _look(self, conn: Watched, stalled: bool) -> None:
        if conn not in self._conns or self._conns[conn] is not None or conn.gone.is_set():
            return  # forgotten, being evicted, or over
        reason = verdict(conn, stalled)
        if reason is not None:
            self._conns[conn] = asyncio.create_task(evict(conn, reason), name="evict")
