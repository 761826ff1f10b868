"""A duplex session's output takes one of two paths through the gateway (``SessionOutput.direct``,
``api/realtime/duplex.py``): while the client reads what it is sent, the output bus's reader
sends each delta itself; while it does not (uvicorn's flow control), the session's own task
sends, waiting for the client, and the events queue. A client that stops reading for a while and
then reads again must get every delta once, numbered without a hole, whichever path each took.

Real processes: a scripted worker answering every input step with 1 s of audio, a uvicorn
gateway, and a WebSocket client with a tiny receive buffer that stops reading for 6 s while it
goes on sending audio, ten 1 s chunks a second: ~8 MB of output meanwhile, more than the kernel's
socket buffers hold (up to 4 MB), so the gateway's writes back up.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from tests.support.client import Client, silence, speech
from tests.support.stack import Stack

TINY_RCVBUF = 4096  # the kernel doubles it
PAUSE_S = 6.0
CHUNK_EVERY_S = 0.1


@pytest.mark.slow
async def test_a_client_that_stops_reading_for_a_while_gets_every_delta_once_in_order(
    stack: Stack,
) -> None:
    stack.start_worker(slots=1, OMNISERVE_BACKEND_OPTIONS='{"trigger": "always"}')
    port = stack.start_gateway(
        OMNISERVE_WS_PING_INTERVAL_S="600",
        OMNISERVE_OUTPUT_MAX_PENDING_BYTES=str(64 * 1024 * 1024),  # held back, not dropped
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TINY_RCVBUF)
    sock.connect(("127.0.0.1", port))
    client = await Client.connect(stack.url(), query="?mode=audio", sock=sock, max_queue=1)
    await client.init()

    async def pump() -> None:
        n = 0
        with contextlib.suppress(ConnectionClosed):
            while True:
                audio = speech() if n % 4 == 0 else silence()
                await client.send({"type": "input.append", "input": {"audio": audio}})
                n += 1
                await asyncio.sleep(CHUNK_EVERY_S)

    sender = asyncio.create_task(pump())
    try:
        numbered: list[dict[str, Any]] = []  # every frame after session.created has a seq

        async def read_for(seconds: float) -> None:
            until = time.monotonic() + seconds
            while (left := until - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    frame = await client.recv(timeout=left)
                    assert frame["type"] != "error", frame
                    numbered.append(frame)

        await read_for(3.0)
        before_pause = len(numbered)
        assert before_pause >= 3, "the session streams"
        await asyncio.sleep(PAUSE_S)  # nothing read: the pump keeps the session busy
        await read_for(PAUSE_S + 4.0)
        assert len(numbered) - before_pause >= 10, "what was held back meanwhile, then more"
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        await client.close()

    seqs = [f["seq"] for f in numbered]
    assert seqs == list(range(1, len(seqs) + 1)), "each event once, in order"
    assert {f.get("kind") for f in numbered} >= {"text", "audio"}
    stack.wait_free(1, timeout=20)
