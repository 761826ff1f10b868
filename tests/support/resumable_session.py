"""A duplex session to drop and resume on another gateway: the scripted reply it is answered
with, and a stack of one worker and two gateways with the session open on the first.

Why: the resume tests and the empty-restart test start the same way, and check what a resumed
client hears against the same reply.
"""

from __future__ import annotations

from typing import Any

from tests.support.client import Client
from tests.support.stack import Stack

REPLY = "one two three four five six seven eight nine ten eleven twelve"  # 4 speaking steps


def text_of(frames: list[dict[str, Any]]) -> str:
    """The text of the answer in ``frames`` (its text deltas, joined)."""
    return "".join(
        f["text"] for f in frames if f["type"] == "response.output.delta" and f["kind"] == "text"
    )


async def open_on_the_first_of_two(stack: Stack) -> tuple[Client, dict[str, Any]]:
    """``stack`` with one worker answering ``REPLY`` and two gateways, and an audio session on
    the first gateway: its client and its ``session.created``."""
    stack.env["OMNISERVE_SCRIPTED_REPLY"] = REPLY
    stack.start_worker()
    stack.start_gateway()
    stack.start_gateway()
    client = await Client.connect(stack.url(0), query="?mode=audio")
    return client, await client.init()
