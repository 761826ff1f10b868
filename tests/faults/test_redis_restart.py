"""The Redis server killed while sessions run and started again, empty (no persistence).

Live duplex sessions (paced by their answers) carry on across the restart: the worker holds
their output and renews their leases on the new server, the gateway keeps the clients and reads
the leases as held meanwhile; no error, no ``session.recovering``, their ``seq`` whole or its
gaps told. /health says not ready while Redis is away, workers register again on their own, a
client that was waiting in the queue is served once a session ends, a new session works within
10 s of Redis answering, and no loop of ours died (heartbeats go on).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.support.carry_on import PacedSession, all_carry_on
from tests.support.client import Client
from tests.support.fault_harness import (
    RestartableRedis,
    all_slots_back,
    await_for,
    log_text,
    served_end_to_end,
)
from tests.support.stack import Stack

RESTORED_S = 10.0  # the promise: service restored within 10 s of Redis answering again


def health(stack: Stack) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{stack.gateways[0][1]}/health", timeout=5)


async def restart_empty(own_redis: RestartableRedis, stack: Stack, down_s: float = 2.0) -> float:
    """Kill Redis, check /health meanwhile, start it empty; returns when it answers again."""
    own_redis.kill()
    await await_for(lambda: health(stack).status_code == 503, 10, "/health to say not ready")
    body = health(stack).json()
    assert body["redis"] is False and body["status"] == "degraded"
    t_down = time.monotonic()
    await await_for(lambda: time.monotonic() - t_down >= down_s, down_s + 5, "the outage")
    own_redis.start()
    return time.monotonic()


@pytest.mark.slow
async def test_redis_restart_empty_while_sessions_run(
    own_redis: RestartableRedis, own_stack: Stack
) -> None:
    stack = own_stack
    threads = stack.start_worker(slots=2)
    prefork = stack.start_worker()
    stack.start_gateway()
    sessions = [await PacedSession.open(stack.url()) for _ in range(3)]
    # every slot is busy: a fourth client waits in the queue through the outage
    waiting = await Client.connect(stack.url(), query="?mode=audio")
    queued = await waiting.until("session.queued", timeout=15)
    assert queued["position"] == 1
    try:
        await await_for(lambda: all(p.steps >= 5 for p in sessions), 30, "first answers")
        t_back = await restart_empty(own_redis, stack)
        # every live session carries on: each is answered again after the restart
        await all_carry_on(sessions, t_back, "Redis restarted empty")
        # the waiting client was not forgotten: its ticket went back into the queue, and it is
        # served when a session ends
        await sessions[0].close()
        done = await waiting.until("session.queue_done", timeout=RESTORED_S + 10)
        assert done["session_id"]
        admitted = time.monotonic() - t_back
        await waiting.send({"type": "session.init", "payload": {}})
        await waiting.until("session.created", timeout=15)
        await waiting.send({"type": "session.close"})
        await waiting.until("session.closed", timeout=15)
        # a new session works end to end within 10 s of Redis answering
        frames = await served_end_to_end(stack.url(), timeout=RESTORED_S)
        took = time.monotonic() - t_back
        print(f"Redis back: queued client admitted after {admitted:.1f} s, new session")
        print(f"served after {took:.1f} s (the queued one included)")
        assert admitted <= RESTORED_S and took <= RESTORED_S
        assert any(f.get("kind") == "text" for f in frames if f["type"] == "response.output.delta")
    finally:
        for p in sessions:
            await p.close()
        await waiting.close()
    # the workers registered again, with every slot, and their heartbeats go on
    all_slots_back(stack, 3)
    r = stack.redis()
    alive = [k for k in r.scan_iter(stack.keys.worker_alive("*"))]
    ttl_before = {k: r.pttl(k) for k in alive}
    time.sleep(1.0)
    assert all(r.pttl(k) > 0 for k in alive) and ttl_before
    for worker in (threads, prefork):
        assert worker.alive()
        text = log_text(worker)
        assert "Redis answers again" in text
        assert "registered again" in text
    assert health(stack).json()["status"] == "ok"


async def test_gateway_commands_after_a_restart_use_fresh_connections(
    own_redis: RestartableRedis,
) -> None:
    """Pooled connections still hold the dead server's sockets after a restart: the first
    command on each must be retried on a new connection, not fail (a client admitted just after
    Redis came back was refused ``service_unavailable`` before)."""
    from api.gateway.state import Gateway
    from omnicore.settings import Settings

    gateway = Gateway(Settings(redis_url=own_redis.url, key_prefix="restart-pool"))
    try:
        # several connections in the pool, all idle
        await asyncio.gather(
            *(gateway.redis.blpop(["restart-pool:none"], timeout=0.2) for _ in range(4))
        )
        own_redis.kill()
        own_redis.start()
        results = await asyncio.gather(*(gateway.redis.incr("restart-pool:n") for _ in range(4)))
        assert sorted(results) == [1, 2, 3, 4]
    finally:
        await gateway.redis.aclose()
