"""Redis Cluster as the data plane: a real cluster of 3 primaries and 3 replicas on loopback.

Gateways and workers are given the cluster (``redis+cluster://``) and, for Celery, a plain
redis-server of their own (``OMNISERVE_BROKER_URL``: kombu has no cluster transport). Duplex
sessions and chat turns are served with their keys spread over the shards, each session's keys
(lease, replay log, input streams, resume record...) on one slot, the admission keys on theirs;
output reaches the gateways over sharded pub/sub. A cluster URL without a broker, or one that
finds no cluster, stops a gateway and a worker at start with one line, exit 1.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio.cluster import ClusterNode

from omniserve.redis_server import free_port
from streaming.redis_connection import (
    AsyncRefusalIsAlive,
    GathersWrites,
    RefusalIsAlive,
    ReopensDropped,
    TimedWrites,
    gateway_client,
    worker_client,
)
from tests.support.carry_on import PacedSession
from tests.support.client import Client
from tests.support.fault_harness import await_for
from tests.support.redis_cluster import RedisClusterSet
from tests.support.script_slots import slots_of
from tests.support.services import running, stack_on
from tests.support.stack import ROOT, Stack

TAG = re.compile(r"\{([^}]*)\}")


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisClusterSet]:
    with running(RedisClusterSet()) as found:
        yield found


@pytest.fixture
def cluster_stack(redis_cluster: RedisClusterSet, redis_server: str) -> Iterator[Stack]:
    with stack_on(redis_cluster.url, redis_server) as stack:
        yield stack


async def chat_turn(url: str, answer: str) -> tuple[str, str]:
    """One chat turn on a new connection: (its session id, the answer's text)."""
    client = await Client.connect(url, query="?mode=chat")
    try:
        created = await client.init()
        content = f"Reply with exactly: {answer}"
        await client.send(
            {"type": "input.append", "input": {"messages": [{"role": "user", "content": content}]}}
        )
        done = await client.until("response.done", timeout=30)
        return str(created["session_id"]), str(done.get("text") or "")
    finally:
        await client.close()


def where_keys_are(cluster: RedisClusterSet, prefix: str) -> dict[str, set[int]]:
    """Hash tag -> the ports of the primaries holding keys of that tag (``prefix``'s keys)."""
    found: dict[str, set[int]] = defaultdict(set)
    for port in cluster.primaries():
        for key in cluster.keys_on(port, f"{prefix}:*"):
            tag = TAG.search(key)
            assert tag, f"a key without a hash tag: {key}"
            found[tag.group(1)].add(port)
    return found


@pytest.mark.slow
async def test_sessions_spread_over_the_shards_of_a_cluster(
    redis_cluster: RedisClusterSet, cluster_stack: Stack
) -> None:
    stack = cluster_stack
    stack.start_worker(slots=4)
    stack.start_worker(slots=4)
    port = stack.start_gateway()
    stack.start_gateway()
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
    assert health["status"] == "ok", health
    topology = health["redis_topology"]
    assert topology["kind"] == "cluster", topology
    assert health["broker"].startswith("redis://127.0.0.1:"), health["broker"]
    assert len(topology["nodes"]) >= 3, topology
    assert not [n for n in health["notes"] if "Redis" in n], health["notes"]  # (each primary's)
    sessions = [await PacedSession.open(stack.url(i % 2)) for i in range(6)]
    try:
        await await_for(lambda: all(p.steps >= 3 for p in sessions), 60, "duplex answers")
        created = [f for p in sessions for f in p.frames if f["type"] == "session.created"]
        live = {str(f["session_id"]) for f in created}
        assert len(live) == 6
        # each live session's keys on one shard and one slot, and the sessions on several
        spread = where_keys_are(redis_cluster, stack.prefix)
        for sid in live:
            assert len(spread[sid]) == 1, (sid, spread[sid])
            own = [
                stack.keys.session_lease(sid),
                stack.keys.output_log(sid),
                stack.keys.input_audio(sid),
                stack.keys.session_resume(sid),
            ]
            assert len(slots_of(own)) == 1
        shards = set().union(*(spread[sid] for sid in live))
        assert len(shards) > 1, spread
        # the admission keys on their own slot, one shard
        assert len(spread[stack.prefix]) == 1, spread[stack.prefix]
        # chat turns alongside, on both gateways
        turns = await asyncio.gather(*(chat_turn(stack.url(i % 2), f"word{i}") for i in range(4)))
        assert [text for _, text in turns] == [f"word{i}" for i in range(4)], turns
        # the duplex sessions carried on meanwhile, without an error
        steps = [p.steps for p in sessions]
        await await_for(
            lambda: all(p.steps > s for p, s in zip(sessions, steps, strict=True)), 30, "more"
        )
        for p in sessions:
            assert p.ended is None and not p.errors(), p.report(0)
            missing, _, duplicated = p.seq_report()
            assert missing == 0 and duplicated == 0, p.report(0)
    finally:
        for p in sessions:
            await p.close()
    # every slot given back once the sessions ended
    await await_for(lambda: stack.free_slots() == 8, 30, "all slots free")
    # and nothing failed on the way: no beat, liveness read, bus read or script call
    for proc in [*stack.workers, *(gateway for gateway, _ in stack.gateways)]:
        log = proc.log.read_text(errors="replace")
        for failure in ("heartbeat failed", "check failed", "read failed", "Traceback"):
            assert failure not in log, f"{proc.name}: {failure}\n{proc.tail()}"


def start_refused(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``omniserve ARGS`` with ``env``, expected to refuse to start (bounded: never a hang)."""
    return subprocess.run(
        [sys.executable, "-m", "omniserve", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_a_cluster_url_without_a_broker_or_a_cluster_stops_at_start(
    redis_cluster: RedisClusterSet, redis_server: str
) -> None:
    stack = Stack(redis_cluster.url)
    for what in (["gateway", "--port", str(free_port())], ["worker", "--backend", "scripted"]):
        refused = start_refused(stack.base_env(), *what)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "set OMNISERVE_BROKER_URL" in refused.stderr, refused.stderr
    # nothing answers at the URL's nodes
    nobody = Stack(f"redis+cluster://127.0.0.1:{free_port()}/", broker_url=redis_server)
    refused = start_refused(nobody.base_env(), "gateway", "--port", str(free_port()))
    assert refused.returncode == 1 and "no Redis Cluster at" in refused.stderr, refused.stderr
    # a server that is not in cluster mode
    plain = redis_server.replace("redis://", "redis+cluster://").rsplit("/", 1)[0]
    not_one = Stack(plain, broker_url=redis_server)
    refused = start_refused(not_one.base_env(), "worker", "--backend", "scripted")
    assert refused.returncode == 1 and "not in cluster mode" in refused.stderr, refused.stderr


async def test_cluster_clients_tune_their_connections(redis_cluster: RedisClusterSet) -> None:
    """The gateway's cluster client opens every node's connections with timed writes, reopened
    drops and ``MISCONF`` health checks; a worker's pipelines go out gathered, with the same
    health checks: on the nodes it started from and on those it learnt of."""
    workers = worker_client(redis_cluster.url, 4)
    try:
        with workers.pipeline(transaction=False) as pipe:
            for i in range(6):
                pipe.set(f"{{w{i}}}tuned", b"x" * 200_000)  # (several pieces, on each shard)
            assert pipe.execute() == [True] * 6
        pools = [
            node.redis_connection.connection_pool
            for node in workers.nodes_manager.nodes_cache.values()
            if node.redis_connection is not None
        ]
        assert pools
        for pool in pools:
            assert issubclass(pool.connection_class, GathersWrites)
            assert issubclass(pool.connection_class, RefusalIsAlive)
        # a node learnt of later (a replica promoted): made the same way, and it answers
        manager = workers.nodes_manager
        learnt = manager.create_redis_node(
            "127.0.0.1", redis_cluster.ports[-1], **manager.connection_kwargs
        )
        assert issubclass(learnt.connection_pool.connection_class, GathersWrites)
        assert learnt.ping()
        learnt.close()
    finally:
        workers.close()
    gateway: Any = gateway_client(redis_cluster.url, 8)
    try:
        for i in range(6):
            await gateway.set(f"{{g{i}}}tuned", b"1")
        nodes = list(gateway.nodes_manager.nodes_cache.values())
        assert len(nodes) >= 3
        for node in nodes:
            assert issubclass(node.connection_class, TimedWrites)
            assert issubclass(node.connection_class, ReopensDropped)
            assert all(isinstance(c, AsyncRefusalIsAlive) for c in node._connections)
        learnt = ClusterNode("127.0.0.1", redis_cluster.ports[-1], **gateway.connection_kwargs)
        assert issubclass(learnt.connection_class, TimedWrites)
    finally:
        await gateway.aclose()
