"""asyncio helpers shared by the gateway and the workers."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any], every_s: float = 0.1) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again while it runs.

    One ``cancel()`` then ``await`` can wait for ever: on Python 3.11 a cancel that lands just as
    a timeout or an awaited event inside the task fires can be absorbed (``wait_for``, and
    redis-py's reads with a timeout, which answer "nothing yet"), and a background loop then
    goes on. Seen as a test teardown (stopping the output bus and the liveness reads) that hung
    for 25 minutes.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every_s)
    if not task.cancelled():
        task.exception()  # retrieved: a loop that failed was logged by itself
