"""A chat turn under way: a client whose long reply has begun, for the tests that cause a fault
in the middle of one."""

from __future__ import annotations

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
