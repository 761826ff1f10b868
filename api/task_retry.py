"""Another slot for a task: a failover's next attempt, or a task whose worker died before it.

Why the second: a slot is handed out and its task pushed onto its worker's queue, and the worker
process dies before it takes the task (a crash, an OOM kill, a node lost). The gateway's
liveness read finds it gone, the task is abandoned (``TaskRelay``: it can never start later)
and the slot withdrawn. Nothing of the session or turn ran, so nothing is lost by running it
elsewhere: it goes to the head of the queue and starts on the next slot that comes (within
``failover_wait_s``, as a failover waits), as its first attempt would have, and the client sees
a longer wait instead of ``worker_connect_failed`` and a trip back to the end of the queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from api.gateway import Gateway
from api.task_relay import TaskNotStarted, TaskRelay
from streaming.jobs import Job
from streaming.output import SessionOutput

log = logging.getLogger("omniserve.gateway")

MAX_STARTS_ELSEWHERE = 3  # workers dying one after the other: then ``worker_connect_failed``


async def _quiet(_frame: dict[str, Any]) -> None:
    """A ticket at the head of the queue tells the client nothing (it was admitted already)."""


async def next_attempt(gw: Gateway, task_id: str, deadline: float) -> int:
    """A number no earlier attempt of this session or turn had, on any gateway or connection
    (a reused one would be ignored by the worker as already claimed)."""
    key = gw.keys.session_attempts(task_id)
    async with gw.redis.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.expireat(key, int(deadline) + 3600)
        n, _ = await pipe.execute()
    return int(n)


async def front_slot(gw: Gateway, task_id: str, deadline: float) -> str | None:
    """A slot taken at the head of the queue within ``failover_wait_s`` (and before
    ``deadline``); None when none came (or admission failed)."""
    wait = min(gw.settings.failover_wait_s, max(0.0, deadline - time.time()))
    try:
        _ticket, slot, _ = await asyncio.wait_for(
            gw.queue.acquire(_quiet, front=True), timeout=wait
        )
    except TimeoutError:
        log.warning("%s: no slot came within %.0f s", task_id, wait)
        return None
    except Exception:
        log.exception("%s: admission at the head of the queue failed", task_id)
        return None
    return slot


async def start_elsewhere(
    gw: Gateway,
    out: SessionOutput,
    task_id: str,
    deadline: float,
    job: Callable[[str, int], Job],
    what: str,
    with_values: Mapping[str, tuple[bytes, int]] | None = None,
) -> TaskRelay | None:
    """The task ``task_id``, whose worker died before starting it, submitted again on a slot
    from the head of the queue as attempt ``job(slot, attempt)`` (``with_values``: written with
    it, see ``Gateway.submit``); None when no slot came in time or the submit failed (the slot
    is given back)."""
    if gw.settings.failover_wait_s <= 0:  # failovers are off: so is this
        return None
    slot = await front_slot(gw, task_id, deadline)
    if slot is None:
        return None
    attempt = job(slot, await next_attempt(gw, task_id, deadline))
    relay = TaskRelay(gw, out, task_id, slot, what, claim_id=attempt.claim_id)
    try:
        await relay.submit(attempt, with_values)
    except TaskNotStarted as exc:
        log.warning("%s: submit to slot %s failed: %s", task_id, slot, exc.detail)
        return None
    log.info("%s: its worker died before it started; sent to slot %s", task_id, slot)
    return relay
