"""Waiting for a worker slot, for every endpoint: the global queue raced against the client.

The client hears ``session.queued`` / ``session.queue_update`` while it waits. The wait ends with
a slot (``Admitted``), the news that none will come (``NoSlot``, which the endpoint renders in
its own dialect), or None when the client left, asked to close, or the deadline passed; the
ticket (or a slot assigned in the meantime) is given back in every case.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from redis.exceptions import ResponseError

from api.gateway.queueing import NoCapacity, Notify
from api.gateway.state import Gateway
from api.gateway.waiting_events import WaitingTask
from api.metrics import telemetry
from api.protocol.errors import Frame
from api.recordings.recorder import SessionRecording
from omnicore.aio import cancel_and_wait
from streaming.admission import QueueFull
from streaming.events import ErrorCode

log = logging.getLogger("omniserve.gateway")


class SlotClient(Protocol):
    """What waiting needs of a client: a WebSocket handler (``ClientSocket``), or an HTTP
    request waiting for its one turn (``api/official/chat_http.py``)."""

    gateway: Gateway
    gone: asyncio.Event  # set when the client left: the wait ends
    recording: SessionRecording

    async def send(self, frame: Frame) -> None: ...


@dataclass(frozen=True, slots=True)
class Admitted:
    """A worker slot is this client's."""

    ticket_id: str
    slot_id: str
    waited: bool  # the client was told it is queued (so it expects session.queue_done)
    assigned_at: float | None = None  # monotonic, when a queued client's slot was taken


@dataclass(frozen=True, slots=True)
class NoSlot:
    """No slot will come: ``service_unavailable``, ``queue_full`` or ``worker_busy``."""

    code: ErrorCode
    detail: str  # what happened, for the message ("no worker is up", a Redis error, ...)


async def wait_for_slot(
    conn: SlotClient,
    deadline: float,
    *stop_events: asyncio.Event,
    notify: Notify | None = None,
    task: WaitingTask | None = None,
) -> Admitted | NoSlot | None:
    """Queue ``conn`` for a slot until ``deadline`` (unix time); see the module docstring.

    ``notify`` receives the queue events instead of the client (a chat turn renames them).
    ``task``: the task the slot is for, which Flower shows while the client waits.
    """
    gateway = conn.gateway
    since = time.monotonic()
    if gateway.writes_refused is not None:  # no ticket could be queued, no slot handed out
        telemetry.rejected(gateway.metrics, ErrorCode.SERVICE_UNAVAILABLE)
        return NoSlot(
            ErrorCode.SERVICE_UNAVAILABLE, f"Redis refuses writes: {gateway.writes_refused}"
        )
    try:
        await gateway.ensure_lease()
        ready = await gateway.has_workers()
    except ResponseError as exc:  # (ensure_lease noted it)
        telemetry.rejected(gateway.metrics, ErrorCode.SERVICE_UNAVAILABLE)
        return NoSlot(ErrorCode.SERVICE_UNAVAILABLE, f"Redis refuses writes: {exc}")
    except Exception as exc:  # noqa: BLE001 - Redis unreachable
        log.warning("cannot count the worker slots: %s", exc)
        telemetry.rejected(gateway.metrics, ErrorCode.SERVICE_UNAVAILABLE)
        return NoSlot(ErrorCode.SERVICE_UNAVAILABLE, "the gateway cannot reach Redis")
    if not ready:
        telemetry.rejected(gateway.metrics, ErrorCode.SERVICE_UNAVAILABLE)
        return NoSlot(ErrorCode.SERVICE_UNAVAILABLE, "no worker is up")
    acquire = asyncio.ensure_future(
        gateway.queue.acquire(
            notify or conn.send,
            owner=conn,
            task=task,
            mode=telemetry.mode_of(conn),
            deadline=deadline,
        )
    )
    stops = [asyncio.ensure_future(conn.gone.wait())]
    stops += [asyncio.ensure_future(ev.wait()) for ev in stop_events]
    try:
        done, _ = await asyncio.wait(
            {acquire, *stops},
            timeout=max(0.0, deadline - time.time()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    except BaseException:
        # this wait itself was cancelled (a chat turn gives its slot back while the turn lease
        # is held elsewhere): the acquire is a task of its own, and got a slot no one released
        await asyncio.shield(_withdraw(gateway, acquire, task))
        raise
    finally:
        for stop in stops:
            stop.cancel()
    if acquire not in done:
        await _withdraw(gateway, acquire, task)
        return None
    try:
        ticket, slot, assigned_at = acquire.result()
    except QueueFull:
        code = ErrorCode.WORKER_BUSY if gateway.settings.max_queue == 0 else ErrorCode.QUEUE_FULL
        telemetry.rejected(gateway.metrics, code)
        return NoSlot(code, "")
    except NoCapacity as exc:  # workers were loading, none became ready in time
        log.warning("admission gave up: %s", exc)
        telemetry.rejected(gateway.metrics, "no_capacity")
        return NoSlot(ErrorCode.SERVICE_UNAVAILABLE, str(exc))
    except Exception as exc:
        log.exception("admission failed")
        return NoSlot(ErrorCode.SERVICE_UNAVAILABLE, str(exc))
    conn.recording.admitted(slot)
    telemetry.admitted(gateway.metrics, telemetry.mode_of(conn), since)
    return Admitted(ticket, slot, assigned_at is not None, assigned_at)


async def _withdraw(
    gateway: Gateway,
    acquire: asyncio.Future[tuple[str, str, float | None]],
    task: WaitingTask | None = None,
) -> None:
    """Cancel a wait in the queue (it leaves the queue, gives back a slot assigned meanwhile).

    Cancelled again until it ends: a cancel that lands while it sends a queue update to the
    client can be swallowed by the socket's send, and the wait then goes on; if it got its slot
    after all, the slot is given back here.
    """
    await cancel_and_wait(acquire)
    if acquire.cancelled() or acquire.exception() is not None:
        return
    _ticket, slot, _assigned_at = acquire.result()
    if task is not None:
        gateway.waiting_events.left(task)  # its task is never sent
    await gateway.admission.release(slot)
