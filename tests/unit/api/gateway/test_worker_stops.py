"""api/gateway/worker_stops.py: a write that stops a worker's session is tried until Redis takes it.

The writes here refuse as Redis does when full (``OutOfMemoryError``); the end-to-end case, a
real Redis at ``maxmemory`` while clients close and leave, is tests/faults/test_redis_full.py.
"""

from __future__ import annotations

import asyncio
import time

import redis
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from api.gateway.worker_stops import WorkerStops
from streaming.controls import CloseControl
from streaming.input import InputReader, InputWriter
from streaming.keys import Keys
from streaming.resume import ResumeStore, WorkerResume


class Refusing:
    """A write Redis refuses ``refusals`` times, then takes."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.tries = 0

    async def __call__(self) -> None:
        self.tries += 1
        if self.tries <= self.refusals:
            raise OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")


async def test_a_write_taken_at_once_is_not_retried() -> None:
    stops, write = WorkerStops(retry_s=0.01), Refusing(0)
    assert await stops.write("stopping s", write, time.time() + 5) is True
    assert write.tries == 1 and stops.pending == 0


async def test_a_refused_write_is_tried_again_until_taken() -> None:
    stops, write = WorkerStops(retry_s=0.01), Refusing(3)
    assert await stops.write("stopping s", write, time.time() + 5) is False
    assert stops.pending == 1
    for _ in range(200):
        if stops.pending == 0:
            break
        await asyncio.sleep(0.01)
    assert write.tries == 4 and stops.pending == 0


async def test_retries_end_with_the_sessions_time() -> None:
    stops, write = WorkerStops(retry_s=0.01), Refusing(10**6)
    await stops.write("stopping s", write, time.time() + 0.1)
    for _ in range(100):
        if stops.pending == 0:
            break
        await asyncio.sleep(0.01)
    assert stops.pending == 0 and 2 <= write.tries < 50


async def test_closing_drops_what_is_pending() -> None:
    stops, write = WorkerStops(retry_s=0.01), Refusing(10**6)
    await stops.write("stopping s", write, time.time() + 60)
    await stops.aclose()
    assert stops.pending == 0
    tries = write.tries
    await asyncio.sleep(0.05)
    assert write.tries == tries


async def test_the_close_and_the_end_of_the_record_reach_the_worker(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, keys: Keys
) -> None:
    """The two writes the gateway retries, on a real Redis, read back as a worker reads them."""
    inputs = InputWriter(async_redis, keys, max_pending=8, ttl_s=60)
    resumes = ResumeStore(async_redis, keys)
    stops = WorkerStops(inputs, resumes, retry_s=0.01)
    try:
        assert await stops.close("rt_s1", "client_closed", time.time() + 5)
        controls = InputReader(sync_redis, keys, "rt_s1").read(block_ms=100).controls
        assert controls == [CloseControl(reason="client_closed")]
        await resumes.create(
            "rt_s2", token="t", mode="audio", gateway="gw1", conn="c1",
            created_seq=1, deadline=0.0, init=b"{}", ttl_s=60,
        )  # fmt: skip
        worker = WorkerResume(sync_redis, keys, "rt_s2")
        before = worker.attachment()
        assert before is not None and not before.ended
        assert await stops.end_record("rt_s2", time.time() + 5)
        after = worker.attachment()
        assert after is not None and after.ended and stops.pending == 0
    finally:
        await inputs.aclose()
