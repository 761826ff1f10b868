"""Waiting for a worker slot, for every endpoint: the global queue raced against the client.

The client hears ``session.queued`` / ``session.queue_update`` while it waits. The wait ends with
a slot (``Admitted``), a refusal the endpoint renders in its own dialect (``Refused``), or None
when the client left, asked to close, or the deadline passed; the ticket (or a slot assigned in
the meantime) is given back in every case.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from api.connection import Connection
from api.queueing import NoCapacity
from streaming.admission import QueueFull
from streaming.events import ErrorCode

log = logging.getLogger("omniserve.gateway")


@dataclass(frozen=True, slots=True)
class Admitted:
    """A worker slot is this client's."""

    ticket_id: str
    slot_id: str
    waited: bool  # the client was told it is queued (so it expects session.queue_done)


@dataclass(frozen=True, slots=True)
class Refused:
    """No slot will come: ``service_unavailable``, ``queue_full`` or ``worker_busy``."""

    code: ErrorCode
    detail: str  # what happened, for the message ("no worker is up", a Redis error, ...)


async def wait_for_slot(
    conn: Connection, deadline: float, close_wanted: asyncio.Event | None = None
) -> Admitted | Refused | None:
    """Queue ``conn`` for a slot until ``deadline`` (unix time); see the module docstring."""
    gw = conn.gw
    try:
        ready = await gw.has_workers()
    except Exception as exc:  # noqa: BLE001 - Redis unreachable
        log.warning("cannot count the worker slots: %s", exc)
        ready = False
    if not ready:
        return Refused(ErrorCode.SERVICE_UNAVAILABLE, "no worker is up")
    acquire = asyncio.ensure_future(gw.queue.acquire(conn.send))
    stops = [asyncio.ensure_future(conn.gone.wait())]
    if close_wanted is not None:
        stops.append(asyncio.ensure_future(close_wanted.wait()))
    try:
        done, _ = await asyncio.wait(
            {acquire, *stops},
            timeout=max(0.0, deadline - time.time()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        for task in stops:
            task.cancel()
    if acquire not in done:
        acquire.cancel()  # leaves the queue, gives back a slot assigned meanwhile
        await asyncio.gather(acquire, return_exceptions=True)
        return None
    try:
        ticket, slot, waited = acquire.result()
    except QueueFull:
        gw.counters["queue_full_total"] += 1
        busy = gw.settings.max_queue == 0
        return Refused(ErrorCode.WORKER_BUSY if busy else ErrorCode.QUEUE_FULL, "")
    except NoCapacity as exc:  # workers were loading, none became ready in time
        log.warning("admission gave up: %s", exc)
        return Refused(ErrorCode.SERVICE_UNAVAILABLE, str(exc))
    except Exception as exc:
        log.exception("admission failed")
        return Refused(ErrorCode.SERVICE_UNAVAILABLE, str(exc))
    return Admitted(ticket, slot, waited)
