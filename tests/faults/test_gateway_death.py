"""kill -9 of one of two gateways while both serve and both have clients waiting in the queue.

The dead gateway's tickets leave the queue within its lease, its sessions' slots come back,
the other gateway's sessions are untouched, and its waiting client is served from the same queue.
"""

from __future__ import annotations

import time

from omnicore.settings import Settings
from tests.support.client import Client
from tests.support.fault_harness import DuplexProbe, await_for, kill9_group, served_end_to_end
from tests.support.stack import Stack

LEASE_S = 2.0  # the gateways' alive key TTL in this test (default 6 s)
# the dead gateway's session is resumable: its worker keeps the slot this long for a resume
HOLD_S = float(Settings.model_fields["resume_slot_hold_s"].default)


async def queued(url: str) -> Client:
    client = await Client.connect(url, query="?mode=audio")
    ev = await client.until("session.queued", "session.queue_done", timeout=15)
    assert ev["type"] == "session.queued", ev
    return client


async def test_kill9_gateway_tickets_dropped_others_untouched(stack: Stack) -> None:
    stack.start_worker(slots=2)
    lease = {"OMNISERVE_GATEWAY_LEASE_TTL_S": str(LEASE_S)}
    stack.start_gateway(**lease)  # 0: dies
    stack.start_gateway(**lease)  # 1: lives
    doomed_url, live_url = stack.url(0), stack.url(1)
    on_doomed = await DuplexProbe.open(doomed_url)
    on_live = await DuplexProbe.open(live_url)
    r = stack.redis()
    waiters: list[Client] = []
    try:
        await await_for(lambda: on_live.deltas_after(0) > 0, 30, "streaming")
        # both slots busy: one waiter on the doomed gateway first, then one on the live one
        waiters.append(await queued(doomed_url))
        live_waiter = await queued(live_url)
        waiters.append(live_waiter)
        assert r.zcard(stack.keys.queue) == 2
        t_kill = kill9_group(stack.gateways[0][0])
        # the live gateway's waiter is next in line once the dead one's ticket is dropped and
        # the dead one's session has released its slot (after the hold kept for a resume)
        done = await live_waiter.until("session.queue_done", timeout=30)
        took = time.monotonic() - t_kill
        print(f"gateway kill -9: the other gateway's waiter admitted after {took:.2f} s")
        assert took <= LEASE_S + HOLD_S + 6.0
        assert done["session_id"]
        await live_waiter.send({"type": "session.init", "payload": {}})
        await live_waiter.until("session.created", timeout=15)
        await await_for(lambda: r.zcard(stack.keys.queue) == 0, 10, "no ticket left")
        # the live gateway's session never noticed
        mark = time.monotonic()
        await await_for(lambda: on_live.deltas_after(mark) >= 2, 20, "still streaming")
        assert on_live.closed_at is None
        assert not any(f["type"] == "error" for _, f in on_live.frames)
        await live_waiter.send({"type": "session.close"})
        await live_waiter.until("session.closed", timeout=15)
    finally:
        for c in waiters:
            await c.close()
        await on_doomed.close()
        await on_live.close()
    stack.wait_free(2, timeout=20)
    await served_end_to_end(live_url)
