"""Clients leaving at every phase, again and again: nothing may leak.

Each round, with both slots of the worker busy: a client leaves while queued, one right after
``session.queue_done``, one during its init, the two streaming ones mid-stream (one with a close
frame, one by a TCP abort with no close at all), and a chat client in the middle of a turn. After
every round the pool is full again and the queue empty; after all rounds a new client is served.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.client import Client
from tests.support.fault_harness import DuplexProbe, served_end_to_end
from tests.support.stack import Stack

ROUNDS = 20
# A vanished duplex client's session waits for a resume and its worker holds the slot this long
# (OMNISERVE_RESUME_SLOT_HOLD_S, 5 s by default): short here, so rounds do not wait on it, but the
# detach-then-give-back path still runs in every round.
SLOT_HOLD = {"OMNISERVE_RESUME_SLOT_HOLD_S": "0.5"}


def abort(client: Client) -> None:
    """Drop the TCP connection without a close frame (a phone going off the network)."""
    client.ws.transport.abort()


async def one_round(stack: Stack, n: int) -> None:
    url = stack.url()
    first = await DuplexProbe.open(url)
    second = await DuplexProbe.open(url)
    # queued, then gone (alternately a close frame and a TCP abort)
    waiter = await Client.connect(url, query="?mode=audio")
    ev = await waiter.until("session.queued", "session.queue_done", timeout=15)
    assert ev["type"] == "session.queued", ev
    if n % 2:
        abort(waiter)
    else:
        await waiter.close()
    # mid-stream: one closes its socket without session.close, one vanishes
    await first.close()
    after_done = await Client.connect(url, query="?mode=audio")
    await after_done.until("session.queue_done", timeout=15)
    await after_done.close()  # gone between queue_done and init
    in_init = await Client.connect(url, query="?mode=audio")
    await in_init.until("session.queue_done", timeout=15)
    await in_init.send({"type": "session.init", "payload": {}})
    abort(in_init)  # gone while the worker prepares the session
    for task in second._tasks:
        task.cancel()
    abort(second.client)
    # a chat turn, left in the middle
    chat = await Client.connect(url, query="?mode=chat")
    await chat.until("session.queue_done", timeout=15)
    await chat.send({"type": "session.init", "payload": {}})
    await chat.until("session.created", timeout=15)
    await chat.send(
        {
            "type": "input.append",
            "input": {
                "messages": [{"role": "user", "content": "a long answer please"}],
                "tts": {"enabled": True},
            },
        }
    )
    await chat.until("response.output.delta", timeout=30)
    if n % 2:
        abort(chat)
    else:
        await chat.close()
    await asyncio.to_thread(stack.wait_free, 2, 20)
    assert stack.redis().zcard(stack.keys.queue) == 0


@pytest.mark.slow
async def test_clients_leave_at_every_phase_repeatedly(stack: Stack) -> None:
    stack.env.update(SLOT_HOLD)
    stack.start_worker(slots=2, OMNISERVE_SCRIPTED_TOKEN_DELAY_S="0.05")
    stack.start_gateway()
    for n in range(ROUNDS):
        await one_round(stack, n)
    assert stack.live_slots() == 2
    await served_end_to_end(stack.url())


async def test_clients_leave_at_every_phase_once(stack: Stack) -> None:
    """The short form of the above, for every run."""
    stack.env.update(SLOT_HOLD)
    stack.start_worker(slots=2, OMNISERVE_SCRIPTED_TOKEN_DELAY_S="0.05")
    stack.start_gateway()
    for n in range(2):
        await one_round(stack, n)
    await served_end_to_end(stack.url())
