"""Sessions spread over the workers, and a worker that joins a running pool takes the next one.

Real processes: one gateway, scripted worker nodes started one after the other, real WebSocket
clients. Until least-loaded dispatch the pool was a plain FIFO: both sessions below ran on the
first worker while the second stood idle.
"""

from __future__ import annotations

import time

from tests.client import Client, silence, speech
from tests.stack import Stack


def running_worker(stack: Stack, session_id: str) -> str:
    """The worker id that claimed the session."""
    owner = stack.redis().get(stack.keys.session_claim(session_id))
    assert owner, "the session was not claimed"
    return str(owner.decode())


async def started(stack: Stack) -> tuple[Client, str]:
    """A duplex session that has answered a step; its client and session id."""
    client = await Client.connect(stack.url(), query="?mode=audio")
    created = await client.init({"system_prompt": "bench"})
    await client.step(speech())
    return client, str(created["session_id"])


async def test_a_worker_that_joins_takes_the_next_session(stack: Stack) -> None:
    stack.start_gateway()
    stack.start_worker(slots=2)
    first, first_id = await started(stack)
    stack.start_worker(slots=2, wait=False)  # 2 idle slots against the first worker's 1
    deadline = time.monotonic() + 60
    while not (stack.live_slots() >= 4 and stack.free_slots() >= 3):  # it joins the pool
        assert time.monotonic() < deadline, "the second worker did not offer its slots"
        await first.step(silence())  # meanwhile the first session goes on (not idle)
    second, second_id = await started(stack)
    a, b = running_worker(stack, first_id), running_worker(stack, second_id)
    assert a != b, f"both sessions on {a}"
    third, third_id = await started(stack)  # 1 idle slot each: either, and none is left
    assert running_worker(stack, third_id) in (a, b)
    for client in (first, second, third):
        await client.send({"type": "session.close"})
        assert (await client.until("session.closed"))["reason"] == "user_stop"
    stack.wait_free(4)  # every slot back in the pool
