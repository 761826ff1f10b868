"""The queue's wait estimate end to end: real Redis, gateway, scripted worker and WebSockets.

One slot. Chat turns (a fraction of a second each) and audio sessions (seconds) have both run
before, so the mean of all holds is near the chat turns'. A chat turn queued behind an audio
session is told about what that session has left, and then waits about that long.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.client import Client
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio

HOLD_S = 8.0  # how long each audio session keeps the slot
QUEUED_AFTER_S = 1.5  # how far into the second audio session the chat turn asks for a slot


async def chat_turn(c: Client, text: str = "Reply with exactly: hi") -> list[dict[str, object]]:
    await c.send(
        {"type": "input.append", "input": {"messages": [{"role": "user", "content": text}]}}
    )
    return await c.collect_until("response.done", timeout=60)


async def audio_session(url: str, started: asyncio.Event | None = None) -> None:
    """An audio session that holds the slot ``HOLD_S`` from its ``session.created``."""
    a = await Client.connect(url, query="?mode=audio")
    await a.init()
    if started is not None:
        started.set()
    await asyncio.sleep(HOLD_S)
    await a.send({"type": "session.close", "reason": "user_stop"})
    await a.until("session.closed", timeout=30)
    await a.close()


async def test_a_chat_turn_behind_an_audio_session_is_told_what_the_session_has_left(
    stack: Stack,
) -> None:
    stack.env["OMNISERVE_CLIENT_IDLE_TIMEOUT_S"] = "0"  # the audio clients only hold the slot
    stack.start_worker()
    stack.start_gateway()
    url = stack.url()
    chat = await Client.connect(url, query="?mode=chat")
    await chat.init()
    turns = []
    for _ in range(3):  # history: short chat turns...
        began = time.monotonic()
        await chat_turn(chat)
        turns.append(time.monotonic() - began)
    await audio_session(url)  # ...and one audio session
    stack.wait_free(1)
    chat_s = max(turns)
    assert chat_s < 2.0
    # the mean of all holds is the chat turns' more than the audio session's
    assert float(stack.redis().hget(stack.keys.duration_stats, "ema_s") or 0) < HOLD_S / 2

    started = asyncio.Event()
    holder = asyncio.create_task(audio_session(url, started))
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.sleep(QUEUED_AFTER_S)
    await chat.send(
        {
            "type": "input.append",
            "input": {"messages": [{"role": "user", "content": "Reply with exactly: next"}]},
        }
    )
    asked = time.monotonic()
    queued = await chat.until("response.queued", timeout=30)
    await chat.until("response.queue_done", timeout=60)
    waited = time.monotonic() - asked
    await chat.until("response.done", timeout=30)
    await holder
    estimate = queued["estimated_wait_s"]
    assert queued["position"] == 1
    assert waited > 2 * chat_s + 2  # the slot was the audio session's for seconds
    assert estimate >= waited / 2 > chat_s  # not what a chat turn takes
    assert abs(estimate - waited) <= 0.4 * waited + 1.5, (estimate, waited)
    await chat.close()
