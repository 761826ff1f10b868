"""Redis frozen (SIGSTOP) for 15 s while sessions and a chat turn run, then thawed: nothing ends.

A stall of Redis itself (a long fork or fsync, a paused VM) lets every TTL run on while nobody can
renew it: the workers' session leases (1.5 s), their presence keys and the gateway's own lease
(6 s) all expire together. Read just after the thaw, they said every worker had died and the
gateway had gone: sessions of a healthy pool were failed over again and again or ended
(``backend_error``, or ``client_closed`` on the worker's side). The readers now time their own
round trips and believe a gone lease only once Redis answers on time again
(``streaming/stalls.py``). Past the 5 s socket timeout, the gateway's receive loops waited on its
input link (the clients' pongs unread: every client dropped) and the workers' input reads failed
their sessions (a chat turn's checks failed it: "inference failed"); none of them waits or
fails now (``streaming/input_link.py``, ``InputReader``, ``WorkerRuntime.gateway_alive``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.support.chat_turn import WORDS, start_chat_turn
from tests.support.fault_harness import (
    DuplexProbe,
    RestartableRedis,
    all_slots_back,
    await_for,
    log_text,
)
from tests.support.stack import Stack

# past the leases (1.5 s; the gateway's 6 s) and twice past the 5 s socket timeout: the input
# link's writes and the workers' input reads time out and go on
FROZEN_S = 15.0


@pytest.mark.slow
async def test_sessions_go_on_through_a_redis_stall(
    own_redis: RestartableRedis, own_stack: Stack
) -> None:
    stack = own_stack
    options = '{"token_delay_s": 0.3}'  # (chat turns only)
    workers = [stack.start_worker(slots=3, OMNISERVE_BACKEND_OPTIONS=options), stack.start_worker()]
    stack.start_gateway()
    probes = [await DuplexProbe.open(stack.url()) for _ in range(3)]
    chat = await start_chat_turn(stack.url())
    try:
        await await_for(lambda: all(p.deltas_after(0) > 0 for p in probes), 30, "first deltas")
        assert own_redis.server is not None
        pid = own_redis.server.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(FROZEN_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        thawed = time.monotonic()
        await asyncio.sleep(6.0)
        for p in probes:
            seen = [(round(t - thawed, 2), f) for t, f in p.frames if t > thawed - FROZEN_S]
            kinds = [f["type"] for _, f in seen]
            assert p.closed_at is None, seen  # (a 15 s stall dropped every client: ping_timeout)
            assert "session.recovering" not in kinds and "session.closed" not in kinds, kinds
            assert p.deltas_after(thawed + 2.0) > 0, kinds  # the session goes on answering
            lost = [f["error"] for _, f in seen if f["type"] == "error"]
            assert lost and all(e["code"] == "inference_error" for e in lost), seen
            assert "was not queued" in lost[0]["message"]  # the chunks Redis never took
        # the chat turn paused with Redis (its checks wait on it) and ends whole: no error
        frames = await chat.collect_until("response.done", "error", timeout=60)
        deltas = "".join(f["text"] for f in chat.received if f["type"] == "response.output.delta")
        assert frames[-1]["type"] == "response.done", frames[-1]
        assert frames[-1]["text"] == deltas == " ".join(["word"] * WORDS)
    finally:
        for p in probes:
            await p.close()
        await chat.close()
    # every slot comes back, and the workers noticed the stall and went on
    all_slots_back(stack, 4)
    for worker in workers:
        assert worker.alive()
        assert "Redis answers again" in log_text(worker)
    assert "leases settle" in log_text(stack.gateways[0][0])
