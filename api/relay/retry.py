"""Another slot for a task: a failover's next attempt, or a task whose worker died before it.

Why the second: a slot is handed out and its task pushed onto its worker's queue, and the worker
process dies before it takes the task (a crash, an OOM kill, a node lost). The gateway's
liveness read finds it gone, the task is abandoned (``TaskRelay``: it can never start later)
and the slot withdrawn. Nothing of the session or turn ran, so nothing is lost by running it
elsewhere: it goes to the head of the queue and starts on the next slot that comes (within
``failover_wait_s``, as a failover waits), as the attempt that did not start would have (a
first attempt anew, a failover's recovering), and the client sees a longer wait instead of
``worker_connect_failed`` and a trip back to the end of the queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from api.gateway.state import Gateway
from api.relay.task import TaskNotStarted, TaskRelay
from streaming.jobs import DuplexJob, Job

log = logging.getLogger("omniserve.gateway")

MAX_STARTS_ELSEWHERE = 3  # workers dying one after the other: then ``worker_connect_failed``


async def _quiet(_frame: dict[str, Any]) -> None:
    """A ticket at the head of the queue tells the client nothing (it was admitted already)."""


async def next_attempt(gateway: Gateway, task_id: str, deadline: float) -> int:
    """A number no earlier attempt of this session or turn had, on any gateway or connection
    (a reused one would be ignored by the worker as already claimed)."""
    key = gateway.keys.session_attempts(task_id)
    async with gateway.redis.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.expireat(key, int(deadline) + 3600)
        n, _ = await pipe.execute()
    return int(n)


async def front_slot(
    gateway: Gateway,
    task_id: str,
    deadline: float,
    until: Sequence[asyncio.Event] = (),
    mode: str = "",
) -> str | None:
    """A slot taken at the head of the queue within ``failover_wait_s`` (and before
    ``deadline``); None when none came (or admission failed), or when one of ``until`` was set
    first (the client closed: the wait ends at once, and a slot that came meanwhile goes back).
    ``mode``: the session's (chat, audio, video), for the wait estimates of those behind it."""
    wait = min(gateway.settings.failover_wait_s, max(0.0, deadline - time.time()))
    acquire = asyncio.ensure_future(
        asyncio.wait_for(
            gateway.queue.acquire(_quiet, front=True, mode=mode, deadline=deadline), timeout=wait
        )
    )
    stops = [asyncio.ensure_future(ev.wait()) for ev in until]
    try:
        await asyncio.wait({acquire, *stops}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for stop in stops:
            stop.cancel()
        if not acquire.done():
            acquire.cancel()  # leaves the queue (Queue.acquire gives back a slot it got)
        await asyncio.gather(acquire, *stops, return_exceptions=True)
    if acquire.cancelled():
        log.info("%s: the wait for a slot ended: the client closed", task_id)
        return None
    exc = acquire.exception()
    if isinstance(exc, TimeoutError):
        log.warning("%s: no slot came within %.0f s", task_id, wait)
        return None
    if exc is not None:
        log.error("%s: admission at the head of the queue failed", task_id, exc_info=exc)
        return None
    _ticket, slot, _ = acquire.result()
    return slot


def next_job(job: Job, slot: str, attempt: int) -> Job:
    """The attempt after ``job`` on ``slot``, of the same kind: a session's first attempt (or a
    fresh one) is followed by a fresh one, which starts it anew; a failover's by another
    failover's, which recovers it (its init and conversation from Redis, its sequence going on)."""
    if isinstance(job, DuplexJob):
        fresh = job.attempt == 0 or job.fresh
        return replace(job, slot_id=slot, attempt=attempt, fresh=fresh)
    return replace(job, slot_id=slot, attempt=attempt)


async def start_elsewhere(
    gateway: Gateway,
    relay: TaskRelay,
    exc: TaskNotStarted,
    stopping: bool,
    with_values: Mapping[str, tuple[bytes, int]] | None = None,
    until: Sequence[asyncio.Event] = (),
) -> TaskRelay | None:
    """The next attempt of ``relay``'s task, whose worker died before starting it (``exc``),
    submitted on a slot from the head of the queue (``with_values``: written with it, see
    ``Gateway.submit``). None when ``exc`` stands: a start deadline rather than a dead worker,
    failovers off, the client ``stopping`` (or one of ``until`` set while it waits for the
    slot), ``MAX_STARTS_ELSEWHERE`` moves already, no slot in time, or the submit failed (the
    slot is given back)."""
    job = relay.job
    if (
        job is None
        or not exc.worker_gone
        or stopping
        or relay.moves >= MAX_STARTS_ELSEWHERE
        or gateway.settings.failover_wait_s <= 0  # failovers are off: so is this
    ):
        return None
    task_id = relay.task_id
    log.warning("%s: %s; starting it on another slot", task_id, exc.detail)
    mode = job.public_mode if isinstance(job, DuplexJob) else "chat"
    slot = await front_slot(gateway, task_id, job.deadline_ts, until, mode)
    if slot is None:
        return None
    attempt = next_job(job, slot, await next_attempt(gateway, task_id, job.deadline_ts))
    moved = TaskRelay(gateway, relay.out, task_id, slot, relay.what, claim_id=attempt.claim_id)
    moved.moves = relay.moves + 1
    try:
        await moved.submit(attempt, with_values)
    except TaskNotStarted as failed:
        log.warning("%s: submit to slot %s failed: %s", task_id, slot, failed.detail)
        return None
    log.info("%s: sent to slot %s as attempt %d", task_id, slot, attempt.attempt)
    return moved
