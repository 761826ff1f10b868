"""A Redis Cluster shard failover: one primary killed, its replica promoted by the cluster.

Gateways and workers are given the cluster (``redis+cluster://``) and a broker of their own.
Live duplex sessions spread over the shards (paced by their answers), and a chat turn in flight:
the primary of a shard holding some of the sessions (not the admission one) is killed with
``kill -9``. Its sessions stall for about the failover time and carry on, with at most one
``session.recovering``/``session.recovered`` pair, no error, their ``seq`` whole or its gaps
told; the sessions on the other shards do not notice (no ``session.recovering``); the chat turn
is answered once; two clients waiting in the queue are served in their order; every slot of the
cluster is served again, and the workers' slots come back. The same with the primary of the
admission shard (the queue, the slot pool, the registry) killed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from redis.crc import key_slot

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
from tests.support.redis_cluster import RedisClusterSet
from tests.support.services import running, stack_on
from tests.support.stack import Stack

NODE_TIMEOUT_MS = 1500  # a silent primary is failed over after about this long
SESSIONS = 6
SLOTS = SESSIONS + 1  # and one for the chat turn: the clients after it wait in the queue


@pytest.fixture
def redis_cluster() -> Iterator[RedisClusterSet]:
    with running(RedisClusterSet(node_timeout_ms=NODE_TIMEOUT_MS)) as found:
        yield found


@pytest.fixture
def cluster_stack(redis_cluster: RedisClusterSet, redis_server: str) -> Iterator[Stack]:
    with stack_on(redis_cluster.url, redis_server) as stack:
        yield stack


def session_id(session: PacedSession) -> str:
    return next(str(f["session_id"]) for f in session.frames if f["type"] == "session.created")


@pytest.mark.slow
@pytest.mark.parametrize("shard", ["sessions", "admission"])
async def test_a_shard_failover_is_carried_by_its_sessions_alone(
    redis_cluster: RedisClusterSet, cluster_stack: Stack, shard: str
) -> None:
    stack = cluster_stack
    stack.start_worker(slots=4, OMNISERVE_SCRIPTED_TOKEN_DELAY_S=TOKEN_DELAY_S)
    stack.start_worker(slots=SLOTS - 4, OMNISERVE_SCRIPTED_TOKEN_DELAY_S=TOKEN_DELAY_S)
    stack.start_gateway()
    stack.start_gateway()
    sessions = [await PacedSession.open(stack.url(i % 2)) for i in range(SESSIONS)]
    waiting: list[Client] = []
    try:
        await await_for(lambda: all(p.steps >= 2 for p in sessions), 60, "first answers")
        shard_of = {
            id(p): redis_cluster.owner(key_slot(stack.keys.session_lease(session_id(p)).encode()))
            for p in sessions
        }
        admission = redis_cluster.owner(key_slot(stack.keys.queue.encode()))
        if shard == "admission":
            victim = admission
        else:
            counts = Counter(port for port in shard_of.values() if port != admission)
            assert counts, f"every session on the admission shard: {shard_of}"
            victim = counts.most_common(1)[0][0]
        hit = [p for p in sessions if shard_of[id(p)] == victim]
        spared = [p for p in sessions if shard_of[id(p)] != victim]
        print(f"{len(hit)} sessions on the killed shard, {len(spared)} on the others")
        replica = redis_cluster.replica_of(victim)
        answers: list[int] = []
        streaming = asyncio.Event()
        in_flight = asyncio.create_task(
            chat_turn(stack.url(1), 60, answers, streaming, answer=LONG_ANSWER)
        )
        await asyncio.wait_for(streaming.wait(), 30)  # a chat turn in flight: its answer begun
        # every slot busy: two clients wait in the queue, in their order
        waiting += await queue_two([stack.url(0), stack.url(1)])
        t_kill = time.monotonic()
        redis_cluster.kill(victim)
        await await_for(lambda: replica in redis_cluster.primaries(), 30, "the replica promoted")
        await await_for(redis_cluster.all_slots_served, 30, "every slot served")
        t_promoted = time.monotonic()
        print(f"promoted {t_promoted - t_kill:.1f} s after the kill")
        await all_carry_on(sessions, t_promoted, "cluster shard failover")
        for p in sessions:
            gaps = [b - a for a, b in zip(p.answered_at, p.answered_at[1:], strict=False)]
            where = "killed shard" if p in hit else "other shard"
            print(f"{where}: longest wait for an answer {max(gaps):.1f} s")
        for p in spared:
            assert p.count("session.recovering") == 0, p.report(t_promoted)
        answered = await in_flight
        print(f"chat turn in flight: {answered!r}, response.done x{answers}")
        assert answered == LONG_ANSWER and answers == [1], answers
        # the waiting clients are served in their order: the first in the chat turn's slot
        await served_in_their_order(waiting)
        # new sessions are served, and the live ones still go on
        await served_end_to_end(stack.url(0), timeout=30)
        t_later = time.monotonic()
        await await_for(lambda: all(p.answers_after(t_later) > 0 for p in sessions), 30, "more")
        assert all(p.carried_on(t_later) for p in sessions), [p.report(t_later) for p in sessions]
    finally:
        for p in sessions:
            await p.close()
        for client in waiting:
            await client.close()
    all_slots_back(stack, SLOTS, timeout=30)
    for proc in stack.workers:
        assert proc.alive(), proc.tail()
