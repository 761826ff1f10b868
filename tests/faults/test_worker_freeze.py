"""A worker frozen (SIGSTOP) past its session lease, then thawed: the session was restarted on
another worker meanwhile, and the thawed attempt gives way.

Its gateway took the frozen worker for lost and restarted the session elsewhere (a failover,
``session.recovering``). Were the thawed attempt to run on beside the new one, it would hold its
slot and a backend for as long as the client stayed, renew the lease as its own, and at its end
delete the lease, the input and the resume record of the new attempt (whose gateway would then
take that worker for lost too: a failover loop). A lease names the slot holding it; the thawed
worker's heartbeat finds another slot's name there, and that attempt ends without a word,
leaving the session's keys alone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.support.fault_harness import (
    DuplexProbe,
    RestartableRedis,
    all_slots_back,
    await_for,
    log_text,
)
from tests.support.stack import Stack

FROZEN_S = 5.0  # past the lease (1.5 s): the session is restarted on the other worker


@pytest.mark.slow
async def test_a_thawed_worker_gives_way_to_the_new_attempt(
    own_redis: RestartableRedis, own_stack: Stack
) -> None:
    stack = own_stack
    first = stack.start_worker()
    stack.start_gateway()
    probe = await DuplexProbe.open(stack.url())  # on the only worker so far
    other = stack.start_worker(wait=False)
    try:
        await await_for(lambda: stack.live_slots() == 2, 120, "the second worker")
        await await_for(lambda: probe.deltas_after(0) > 0, 30, "first deltas")
        os.killpg(first.popen.pid, signal.SIGSTOP)
        try:
            await await_for(lambda: probe.first("session.recovered") is not None, 30, "failover")
            await asyncio.sleep(max(0.0, FROZEN_S - 2.0))
        finally:
            os.killpg(first.popen.pid, signal.SIGCONT)
        thawed = time.monotonic()
        # the thawed attempt ends and its slot is free again, while the client stays
        await await_for(lambda: stack.free_slots() == 1, 15, "its slot free")
        assert "runs on another slot now" in log_text(first)
        await await_for(
            lambda: "running on another slot now; this attempt ends" in log_text(first),
            5,
            "the attempt's end logged",
        )
        await asyncio.sleep(4.0)
        kinds = [f["type"] for _, f in probe.frames]
        assert probe.closed_at is None, kinds[-5:]
        assert kinds.count("session.recovering") == 1, kinds
        assert "session.closed" not in kinds and "error" not in kinds, kinds
        assert probe.deltas_after(thawed + 3.0) > 0  # the new attempt answers on
        assert "outcome=taken" in log_text(first)
    finally:
        await probe.close()
    all_slots_back(stack, 2, timeout=20)
    assert first.alive() and other.alive()
