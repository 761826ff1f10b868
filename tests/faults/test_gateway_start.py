"""A gateway started while Redis is away, or answers but refuses writes (a gateway that comes up
before its Redis, or is rolled out while Redis is full).

The gateway starts all the same, with no crash loop under a process manager: ``/healthz`` answers,
``/readyz`` and ``/health`` say why it is not ready, a client is refused ``service_unavailable``
with the reason, and once Redis answers (and takes writes) the gateway takes its lease,
subscribes and serves, with no restart.
"""

from __future__ import annotations

import time

import httpx
import pytest

from omniserve.redis_server import free_port
from tests.support.client import Client
from tests.support.fault_harness import RestartableRedis, log_text, served_end_to_end, wait_for
from tests.support.stack import Stack


def get(port: int, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)


async def refused_with(url: str) -> str:
    """A new audio client's refusal message (``service_unavailable``, close code 1013)."""
    client = await Client.connect(url, query="?mode=audio")
    try:
        err = await client.until("error", timeout=15)
        assert err["error"]["code"] == "service_unavailable", err
        assert await client.closed(timeout=10) == 1013
        return str(err["error"]["message"])
    finally:
        await client.close()


@pytest.mark.slow
@pytest.mark.parametrize("redis_state", ["away", "refusing", "replica"])
async def test_a_gateway_started_without_a_usable_redis_serves_once_it_is(
    own_redis: RestartableRedis, own_stack: Stack, redis_state: str
) -> None:
    stack = own_stack
    if redis_state == "away":
        own_redis.stop()
    elif redis_state == "refusing":
        stack.redis().config_set("maxmemory", "1")  # full: every write that could grow it refused
    else:
        stack.redis().replicaof("127.0.0.1", str(free_port()))  # of a primary nobody runs
    port = stack.start_gateway(ready_path="/healthz")
    gateway = stack.gateways[0][0]
    time.sleep(2.5)  # a few lease renewals fail meanwhile
    assert gateway.alive(), gateway.tail()

    ready = get(port, "/readyz")
    assert ready.status_code == 503, ready.text
    health = get(port, "/health")
    assert health.status_code == 503, health.text
    if redis_state == "away":
        assert ready.json()["redis"] is False, ready.json()
        assert "cannot reach Redis" in await refused_with(stack.url())
    else:
        assert ready.json()["redis_writable"] is False, ready.json()
        assert any("Redis refuses writes" in n for n in health.json()["notes"]), health.json()
        assert "Redis refuses writes" in await refused_with(stack.url())
    if redis_state == "replica":  # and what Redis lacks is named (streaming/redis_requirements)
        assert any("Redis is a replica" in n for n in health.json()["notes"]), health.json()

    if redis_state == "away":
        own_redis.start()  # the same port, empty
    elif redis_state == "refusing":
        stack.redis().config_set("maxmemory", "0")
    else:
        stack.redis().replicaof("NO", "ONE")
    stack.start_worker()
    wait_for(lambda: get(port, "/readyz").status_code == 200, 15, "/readyz to say ready")
    health = get(port, "/health")
    assert health.json()["status"] == "ok", health.json()
    assert not any("replica" in n for n in health.json()["notes"]), health.json()
    frames = await served_end_to_end(stack.url())
    assert any(f["type"] == "response.output.delta" for f in frames)
    assert gateway.alive(), gateway.tail()
    # the gateway's lease is there (a worker ends the sessions of a gateway that has none),
    # and it hears the queue's events (who is admitted, who left)
    gateway_id = get(port, "/healthz").json()["gateway_id"]
    assert stack.redis().exists(stack.keys.gateway_alive(gateway_id))
    channel = stack.keys.queue_events
    assert dict(stack.redis().pubsub_numsub(channel)) == {channel.encode(): 1}

    text = log_text(gateway)
    assert "Application startup failed" not in text
    if redis_state == "away":
        # said once for the outage, not at every lease renewal; and when it ended
        assert text.count("cannot reach Redis") == 1, text
        assert "reaches Redis again" in text
    else:
        assert text.count("Redis refuses writes (") == 1, text
        assert "Redis takes writes again" in text


@pytest.mark.slow
async def test_a_redis_that_evicts_keys_is_named_on_health(
    own_redis: RestartableRedis, own_stack: Stack
) -> None:
    """An evicting ``maxmemory-policy`` (the default of several managed services) works until
    memory fills, then drops queue, lease and stream keys without an error: the gateway says so
    in its log and on ``/health`` from its start, and the service serves meanwhile."""
    stack = own_stack
    stack.redis().config_set("maxmemory-policy", "allkeys-lru")
    port = stack.start_gateway()
    stack.start_worker()
    body = get(port, "/health").json()
    assert body["status"] == "ok", body
    assert any("maxmemory-policy is allkeys-lru" in n for n in body["notes"]), body
    frames = await served_end_to_end(stack.url())
    assert any(f["type"] == "response.output.delta" for f in frames)
    text = log_text(stack.gateways[0][0])
    assert text.count("maxmemory-policy is allkeys-lru") == 1, text  # (once, not every minute)
