"""A chat turn under way: a client whose long reply has begun, for the tests that cause a fault
in the middle of one; and a whole turn on a connection of its own, its answers counted."""

from __future__ import annotations

import asyncio

from tests.support.client import Client

WORDS = 40  # a chat turn's reply, one word every 0.3 s: generated before, during and after


async def start_chat_turn(url: str, words: int = WORDS) -> Client:
    """A chat client whose turn (``words`` words long) has begun answering."""
    chat = await Client.connect(url, query="?mode=chat")
    await chat.until("session.queue_done")
    await chat.send({"type": "session.init", "payload": {}})
    await chat.until("session.created")
    content = "Reply with exactly: " + " ".join(["word"] * words)
    await chat.send(
        {"type": "input.append", "input": {"messages": [{"role": "user", "content": content}]}}
    )
    await chat.until("response.output.delta", timeout=30)
    return chat


LONG_ANSWER = "moved across the failover one word at a time"
TOKEN_DELAY_S = "0.3"  # per word of a chat answer: the long one takes about 2.4 s


async def chat_turn(
    url: str,
    timeout: float,
    answers: list[int] | None = None,
    streaming: asyncio.Event | None = None,
    answer: str = "moved",
) -> str:
    """One chat turn's answer through a new connection (``answers``: gets how many
    ``response.done`` the turn brought, counted a moment after the first; ``streaming``: set
    at the answer's first delta)."""
    client = await Client.connect(url, query="?mode=chat")
    try:
        await client.init()
        await client.send(
            {
                "type": "input.append",
                "input": {
                    "messages": [{"role": "user", "content": f"Reply with exactly: {answer}"}]
                },
            }
        )
        if streaming is not None:
            await client.until("response.output.delta", timeout=timeout)
            streaming.set()
        done = await client.until("response.done", timeout=timeout)
        if answers is not None:
            try:
                await client.until("response.done", timeout=2)
            except TimeoutError:
                pass
            answers.append(sum(1 for f in client.received if f["type"] == "response.done"))
        return str(done.get("text") or "")
    finally:
        await client.close()
