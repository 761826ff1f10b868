"""Clients that stopped keeping up: found within seconds, their work freed, their socket torn down.

One small task per connection (``watch``) looks for three signs:

- silence: a duplex client that holds a worker slot must send (audio every second); one that
  sends nothing for ``client_idle_timeout_s`` is ``client_idle``;
- pings: uvicorn pings every ``ws_ping_interval_s`` and fails a peer that has not answered within
  ``ws_ping_timeout_s`` (close 1011): ``ping_timeout``;
- output: the session's undelivered output passed its caps (``streaming/output.py``):
  ``output_backpressure``.

Ending such a client frees its worker first (``Connection.on_evict`` tells the worker to close
the session, so the slot is back within a step), then gives the session ``EVICT_GRACE_S`` to end
the ordinary way (a client that still reads gets ``session.closed`` with the reason), and then
aborts the TCP connection. Without the abort a client that never reads would keep a blocked send,
its socket and its write buffer for ever: asyncio flushes a closing transport before letting it
go, and a peer that answers with a zero TCP window never times out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from starlette.websockets import WebSocket

from api.gateway import Gateway
from streaming.events import CloseReason

log = logging.getLogger("omniserve.gateway")


class Watched(Protocol):
    """What the watch needs of a connection (``api/connection.py``'s ``Connection``)."""

    gw: Gateway
    ws: WebSocket
    log_id: str
    gone: asyncio.Event
    alarm: asyncio.Event  # set to have the connection looked at now
    output_overflowed: bool
    evict_reason: CloseReason | None

    def idle_seconds(self) -> float:
        """How long the client has been silent while it owes input (0: it owes none)."""

    async def on_evict(self, reason: CloseReason) -> None:
        """Free the worker the connection holds."""


CHECK_S = 0.5  # how often a connection is looked at (an output overflow wakes it at once)
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
            f"sent nothing for {conn.gw.settings.client_idle_timeout_s:g} s while holding a slot"
        ),
        CloseReason.PING_TIMEOUT: "stopped answering WebSocket pings",
        CloseReason.OUTPUT_BACKPRESSURE: "did not read its output (over the cap)",
    }.get(reason, str(reason))
    log.warning("%s: the client %s; ending the session (%s)", conn.log_id, why, reason)
    conn.gw.metrics.clients_dropped.labels(str(reason)).inc()


def verdict(conn: Watched, stalled: bool = False) -> CloseReason | None:
    """Why this connection must end now, or None.

    ``stalled``: this process's event loop has just been held up (a long GC pause, the process
    stopped): frames that arrived meanwhile are not read yet, so silence proves nothing now.
    """
    if conn.output_overflowed:
        return CloseReason.OUTPUT_BACKPRESSURE
    if pings_failed(conn.ws):
        return CloseReason.PING_TIMEOUT
    limit = conn.gw.settings.client_idle_timeout_s
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


async def watch(conn: Watched) -> None:
    """Run beside the connection until it ends; evict it when ``verdict`` says so."""
    loop = asyncio.get_running_loop()
    while not conn.gone.is_set():
        # a timer, not wait_for: no task per look (thousands of connections look twice a second)
        looked = time.monotonic()
        timer = loop.call_later(CHECK_S, conn.alarm.set)
        await conn.alarm.wait()
        timer.cancel()
        conn.alarm.clear()
        if conn.gone.is_set():
            break
        reason = verdict(conn, stalled=time.monotonic() - looked > CHECK_S + STALL_S)
        if reason is not None:
            await evict(conn, reason)
            return
    if conn.evict_reason is None and pings_failed(conn.ws):
        conn.evict_reason = CloseReason.PING_TIMEOUT  # uvicorn closed it already: just say so
        note(conn, CloseReason.PING_TIMEOUT)
