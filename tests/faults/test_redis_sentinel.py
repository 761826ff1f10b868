"""Redis behind Sentinel: the primary killed, a replica promoted at another address.

Gateways and workers are given only the Sentinel's address (``redis+sentinel://``). Before,
every process kept the primary's one address, and after a failover nothing reached the new
primary. Now each pool asks the Sentinel where the primary is: sessions in flight go on or end
with a reason, the workers' slots come back on the new primary, and a new session (a duplex one
and a chat turn) is served soon after the promotion, with nobody stepping in; the old primary
that comes back (empty) is demoted by the Sentinel and never written to.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.support.client import Client
from tests.support.fault_harness import DuplexProbe, all_slots_back, await_for, served_end_to_end
from tests.support.redis_sentinel import SentinelSet
from tests.support.stack import Stack

RESTORED_S = 15.0  # a new session served within this long of the promotion


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    found = SentinelSet()
    try:
        found.start()
        yield found
    finally:
        found.stop()


@pytest.fixture
def sentinel_stack(sentinels: SentinelSet) -> Iterator[Stack]:
    stack = Stack(sentinels.url)
    try:
        yield stack
    finally:
        stack.stop()


async def chat_turn(url: str, timeout: float) -> str:
    """One chat turn's answer through a new connection."""
    client = await Client.connect(url, query="?mode=chat")
    try:
        await client.init()
        await client.send(
            {
                "type": "input.append",
                "input": {"messages": [{"role": "user", "content": "Reply with exactly: moved"}]},
            }
        )
        done = await client.until("response.done", timeout=timeout)
        return str(done.get("text") or "")
    finally:
        await client.close()


@pytest.mark.slow
async def test_a_sentinel_failover_is_followed(
    sentinels: SentinelSet, sentinel_stack: Stack
) -> None:
    stack = sentinel_stack
    threads = stack.start_worker(slots=2)
    prefork = stack.start_worker()
    port = stack.start_gateway()
    assert await chat_turn(stack.url(), 30) == "moved"
    probes = [await DuplexProbe.open(stack.url()) for _ in range(2)]
    try:
        await await_for(lambda: all(p.deltas_after(0) > 0 for p in probes), 30, "first deltas")
        primary, replica = sentinels.ports
        sentinels.kill(primary)
        promoted_in = sentinels.wait_primary(replica, 30)
        t_promoted = time.monotonic()
        # the workers' slots come back on the new primary (as after a Redis restart, a client
        # that arrives before they do is told service_unavailable), then new sessions are served
        await await_for(lambda: stack.live_slots() == 3, RESTORED_S, "the slots on the new primary")
        back_in = time.monotonic() - t_promoted
        frames = await served_end_to_end(stack.url(), timeout=RESTORED_S)
        served_in = time.monotonic() - t_promoted
        assert any(f.get("kind") == "text" for f in frames if f["type"] == "response.output.delta")
        assert await chat_turn(stack.url(), 30) == "moved"
        print(
            f"promoted {promoted_in:.1f} s after the kill; slots back {back_in:.1f} s and a new"
            f" session served {served_in:.1f} s after the promotion"
        )
        assert served_in <= RESTORED_S
        # each session in flight went on streaming, or ended with an error and a reason
        t_check = time.monotonic()
        await await_for(
            lambda: all(p.closed_at is not None or p.deltas_after(t_check) > 0 for p in probes),
            30,
            "each session in flight to go on or end",
        )
        for p in probes:
            errors = [f["error"]["code"] for _, f in p.frames if f["type"] == "error"]
            print("in flight:", p.closed_reason() or "streams on", errors)
            if p.closed_at is not None:  # as after a Redis restart: its lease lapsed meanwhile
                assert errors and errors[-1] in ("backend_error", "output_gap"), p.frames[-3:]
                assert p.closed_reason() is not None
    finally:
        for p in probes:
            await p.close()
    # every slot back and idle on the new primary (the data nodes are found through Sentinel)
    all_slots_back(stack, 3, timeout=30)
    assert sentinels.primary_port() == replica
    # the old primary comes back empty, a primary of nothing until the Sentinel demotes it: no
    # connection goes there, and the service goes on as it was
    sentinels.start_node(primary)
    keys_while_primary: list[int] = []  # databases with keys; the heartbeats write every 0.5 s

    def demoted() -> bool:
        role = sentinels.role(primary)
        if role == "master":
            keys_while_primary.append(len(redis.Redis(port=primary).info("keyspace")))
        return role == "slave"

    await await_for(demoted, 30, "the old primary demoted")
    assert keys_while_primary and not any(keys_while_primary), keys_while_primary
    assert await chat_turn(stack.url(), 30) == "moved"
    await served_end_to_end(stack.url(), timeout=RESTORED_S)
    all_slots_back(stack, 3)
    assert threads.alive() and prefork.alive()
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
    assert health["status"] == "ok", health
