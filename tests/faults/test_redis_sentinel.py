"""Redis behind Sentinel: the primary killed, a replica promoted at another address.

Gateways and workers are given only the Sentinel's address (``redis+sentinel://``), and each
pool asks the Sentinel where the primary is: live duplex sessions (paced by their answers) carry
on across the promotion, with no error, no ``session.recovering`` and their ``seq`` whole or its
gaps told; a chat turn sent as the primary dies is answered once; two clients waiting in the
queue are served in their order; the workers' slots come back on the new primary, and a new
session (a duplex one and a chat turn) is served soon after the promotion, with nobody stepping
in; the old primary that comes back (empty) is demoted by the Sentinel and never written to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.support.carry_on import PacedSession, all_carry_on
from tests.support.chat_turn import LONG_ANSWER, TOKEN_DELAY_S, chat_turn
from tests.support.client import Client
from tests.support.fault_harness import (
    all_slots_back,
    await_for,
    queue_two,
    served_end_to_end,
    served_in_their_order,
)
from tests.support.redis_sentinel import SentinelSet
from tests.support.services import running, stack_on
from tests.support.stack import Stack

RESTORED_S = 15.0  # a new session served within this long of the promotion


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    with running(SentinelSet()) as found:
        yield found


@pytest.fixture
def sentinel_stack(sentinels: SentinelSet) -> Iterator[Stack]:
    with stack_on(sentinels.url) as stack:
        yield stack


@pytest.mark.slow
async def test_a_sentinel_failover_is_followed(
    sentinels: SentinelSet, sentinel_stack: Stack
) -> None:
    stack = sentinel_stack
    threads = stack.start_worker(slots=3, OMNISERVE_SCRIPTED_TOKEN_DELAY_S=TOKEN_DELAY_S)
    prefork = stack.start_worker(OMNISERVE_SCRIPTED_TOKEN_DELAY_S=TOKEN_DELAY_S)
    port = stack.start_gateway()
    assert await chat_turn(stack.url(), 30) == "moved"
    sessions = [await PacedSession.open(stack.url()) for _ in range(3)]
    waiting: list[Client] = []
    try:
        await await_for(lambda: all(p.steps >= 2 for p in sessions), 30, "first answers")
        primary, replica = sentinels.ports
        answers: list[int] = []
        streaming = asyncio.Event()
        in_flight = asyncio.create_task(
            chat_turn(stack.url(), 60, answers, streaming, answer=LONG_ANSWER)
        )
        await asyncio.wait_for(streaming.wait(), 30)  # a chat turn in flight: its answer begun
        # every slot busy: two clients wait in the queue, in their order
        waiting += await queue_two([stack.url(), stack.url()])
        t_kill = time.monotonic()
        sentinels.kill(primary)
        promoted_in = await asyncio.to_thread(sentinels.wait_primary, replica, 30)
        t_promoted = time.monotonic()
        # every live session carries on: each is answered again after the promotion
        await all_carry_on(sessions, t_promoted, "sentinel failover")
        answered = await in_flight
        print(f"chat turn in flight: {answered!r}, response.done x{answers}")
        assert answered == LONG_ANSWER and answers == [1], answers
        # the waiting clients are served in their order: the first in the chat turn's slot
        await served_in_their_order(waiting)
        for p in sessions:
            stall = max(b - a for a, b in zip(p.answered_at, p.answered_at[1:], strict=False))
            print(f"longest wait for an answer {stall:.1f} s ({t_promoted - t_kill:.1f} s outage)")
        # the workers' slots come back on the new primary, then new sessions are served
        await await_for(lambda: stack.live_slots() == 4, RESTORED_S, "the slots on the new primary")
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
        t_later = time.monotonic()  # and they still do
        await await_for(lambda: all(p.answers_after(t_later) > 0 for p in sessions), 30, "more")
        assert all(p.carried_on(t_later) for p in sessions), [p.report(t_later) for p in sessions]
    finally:
        for p in sessions:
            await p.close()
        for client in waiting:
            await client.close()
    # every slot back and idle on the new primary (the data nodes are found through Sentinel)
    all_slots_back(stack, 4, timeout=30)
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
    all_slots_back(stack, 4)
    assert threads.alive() and prefork.alive()
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
    assert health["status"] == "ok", health
