"""A resumable session whose client is away when Redis restarts empty (the soak's leak).

Its resume record is lost with everything else, so nobody can resume it; its gateway had
detached it and will not stop it. The worker must end it and give the slot back at once, not
hold the slot until the session's deadline because the gateway that submitted it is alive.
"""

from __future__ import annotations

import time

import pytest

from tests.support.client import Client
from tests.support.fault_harness import RestartableRedis, log_text, served_end_to_end, wait_for
from tests.support.stack import Stack

FREED_S = 15.0  # Redis back -> the slot free again: re-registration plus one presence check


def pool_idle(stack: Stack) -> bool:
    r = stack.redis()
    return (
        stack.live_slots() == 1
        and stack.free_slots() == 1
        and not r.smembers(stack.keys.busy_slots)
    )


@pytest.mark.slow
async def test_detached_session_gives_slot_back_when_redis_restarts_empty(
    own_redis: RestartableRedis, own_stack: Stack
) -> None:
    stack = own_stack
    # the slot hold and the grace are long: only the lost record may free the slot in time
    stack.env.update({"OMNISERVE_RESUME_SLOT_HOLD_S": "300", "OMNISERVE_RESUME_GRACE_S": "600"})
    worker = stack.start_worker()
    stack.start_gateway()
    client = await Client.connect(stack.url(), query="?mode=audio")
    created = await client.init()
    sid = created["session_id"]
    assert created["resume_token"]
    await client.ws.close()  # the client vanishes: the session is detached, the slot held
    r = stack.redis()
    record = stack.keys.session_resume(sid)
    wait_for(lambda: r.hget(record, "detached_at") not in (None, b""), 10, "the detach")
    assert stack.free_slots() == 0
    own_redis.kill()
    time.sleep(1.0)
    own_redis.start()
    t_back = time.monotonic()
    took = wait_for(lambda: pool_idle(stack), FREED_S, "the slot back in the pool")
    print(f"slot free {time.monotonic() - t_back:.1f} s after Redis answered ({took:.1f} s)")
    text = log_text(worker)
    assert sid in text, text[-3000:]
    # and the slot serves the next client
    frames = await served_end_to_end(stack.url(), timeout=20)
    assert any(f["type"] == "session.closed" for f in frames)
    assert worker.alive()
