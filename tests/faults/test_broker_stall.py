"""RabbitMQ, the broker of its own, frozen (SIGSTOP) and thawed: a session admitted meanwhile
is refused with ``worker_connect_failed`` and its slot freed (the gateway's publish waits for
RabbitMQ's confirm, then gives up), never left hanging; after the thaw new sessions are served
again with no restart of anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.support.client import Client
from tests.support.fault_harness import await_for, served_end_to_end
from tests.support.rabbitmq import RabbitMQ
from tests.support.services import running
from tests.support.stack import Stack

REFUSED_WITHIN_S = 90.0  # a backstop for the hang this test is about, not a figure


@pytest.fixture
def rabbitmq() -> Iterator[RabbitMQ]:
    with running(RabbitMQ()) as node:
        try:
            yield node
        finally:
            node.freeze(False)  # thawed, so that its stop is heard


@pytest.mark.slow
async def test_a_frozen_rabbitmq_refuses_new_sessions_and_serves_them_after_the_thaw(
    redis_server: str, rabbitmq: RabbitMQ
) -> None:
    stack = Stack(redis_server, env={"OMNISERVE_BROKER_URL": rabbitmq.url})
    try:
        stack.start_worker(slots=2)
        stack.start_gateway()
        await served_end_to_end(stack.url())
        await await_for(lambda: stack.free_slots() == 2, 20, "the slots back")
        rabbitmq.freeze(True)
        t_frozen = time.monotonic()
        client = await Client.connect(stack.url(), query="?mode=audio")
        try:
            error = await client.until("error", timeout=REFUSED_WITHIN_S)
        finally:
            await client.close()
        print(f"refused {time.monotonic() - t_frozen:.1f} s after the freeze: {error}")
        assert error["error"]["code"] == "worker_connect_failed", error
        await await_for(lambda: stack.free_slots() == 2, 20, "the refused session's slot back")
        rabbitmq.freeze(False)
        frames = await served_end_to_end(stack.url(), timeout=60)
        assert any(f["type"] == "session.closed" for f in frames)
    finally:
        rabbitmq.freeze(False)
        await asyncio.to_thread(stack.stop)
