"""A network partition between one component and Redis, while the rest of the service reaches
it: the gateway's link cut for 8 s (past its lease, 6 s), or a worker's (past its sessions'
leases, 1.5 s). Each runs on meanwhile, unlike a frozen process.

The link is a proxy process (``tests/support/tcp_proxy.py``) frozen with SIGSTOP: connections
stay open and nothing passes either way, then everything waiting passes. (Packets are not
dropped: the kernel cannot be made to here, so no TCP retransmission backoff is added after the
cut heals; a worker drops a connection silent past its socket timeout and opens another.)

What a client must see: its session goes on. A cut gateway's sessions wait and go on (each may
see one ``inference_error`` for input the gateway could not queue); a cut worker's sessions are
restarted on another worker (``session.recovering``, ``session.recovered``), and the cut worker,
once back, ends its stale attempts without a word and serves again. Every slot comes back.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from omniserve.redis_server import free_port
from tests.support.fault_harness import (
    RestartableRedis,
    all_slots_back,
    await_for,
    log_text,
    open_with_one_link_apart,
    served_end_to_end,
)
from tests.support.stack import Stack
from tests.support.tcp_proxy import Link

CUT_S = 8.0


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["gateway", "worker"])
async def test_sessions_outlive_a_partition_from_redis(
    own_redis: RestartableRedis, own_stack: Stack, cut: str
) -> None:
    stack = own_stack
    link = Link(free_port(), own_redis.port)
    try:
        url = f"redis://127.0.0.1:{link.port}/0"
        probes, spare = await open_with_one_link_apart(stack, cut, url)
        try:
            await await_for(lambda: all(p.deltas_after(0) > 0 for p in probes), 30, "deltas")
            began = time.monotonic()
            with link.cut():
                await asyncio.sleep(CUT_S)
            healed = time.monotonic()
            await asyncio.sleep(10.0)
            for p in probes:
                seen = [(round(t - began, 2), f) for t, f in p.frames if t > began]
                kinds = [f["type"] for _, f in seen if "delta" not in f["type"]]
                assert p.closed_at is None and "session.closed" not in kinds, seen
                errors = [f["error"]["code"] for _, f in seen if f["type"] == "error"]
                assert set(errors) <= {"inference_error"}, seen
                if cut == "worker":
                    assert kinds.count("session.recovering") == 1, kinds
                    assert kinds.count("session.recovered") == 1, kinds
                else:
                    assert kinds.count("session.recovering") <= 1, kinds
                assert p.deltas_after(healed + 5.0) > 0, kinds  # it goes on answering
        finally:
            for p in probes:
                await p.close()
        all_slots_back(stack, 4)
        if spare is not None:
            assert "runs on another slot now" in log_text(stack.workers[0])
            spare.stop()  # the next session can only run on the worker that was cut off
            await await_for(lambda: stack.live_slots() == 2, 30, "the spare's slots withdrawn")
        frames = await served_end_to_end(stack.url())
        assert any(f["type"] == "response.output.delta" for f in frames)
        assert all(p.alive() for p, _ in stack.gateways) and stack.workers[0].alive()
    finally:
        stack.stop()  # (while the link still carries what they say on the way out)
        link.close()
