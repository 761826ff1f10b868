"""A real client process for fault tests and the soak: one duplex session streaming audio.

    python -m bench.fault_client URL [--mode audio] [--no-read]

It prints ``ACTIVE <session_id>`` once the session is created, then sends a chunk every 0.3 s
(speech, then silence, so the scripted backend answers). A test freezes it with SIGSTOP (the TCP
connection stays up, nothing more is sent or read), or starts it with ``--no-read``: a tiny
receive buffer and no reads after ``session.created``, so the server's output piles up while the
client goes on sending. It prints ``CLOSED`` when its connection ends.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from urllib.parse import urlsplit

import numpy as np
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from api.protocol.events import ClientEvent, ServerEvent
from omnicore.audio import pcm_to_b64

TINY_RCVBUF = 4096  # the kernel doubles it; still a few KB
_T = np.arange(16000) / 16000
SPEECH = pcm_to_b64((0.2 * np.sin(2 * np.pi * 220 * _T)).astype(np.float32))  # heard as speech
SILENCE = pcm_to_b64(np.zeros(16000, dtype=np.float32))


async def until(ws: ClientConnection, kind: str) -> dict[str, object]:
    while True:
        frame: dict[str, object] = orjson.loads(await ws.recv())
        if frame.get("type") == kind:
            return frame


async def run(url: str, mode: str, no_read: bool) -> None:
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if no_read:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TINY_RCVBUF)
    sock.connect((parts.hostname or "127.0.0.1", parts.port or 80))
    async with connect(
        f"{url}/v1/realtime?mode={mode}",
        sock=sock,
        max_size=None,
        max_queue=1 if no_read else 16,
    ) as ws:
        await until(ws, ServerEvent.SESSION_QUEUE_DONE)
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_INIT, "payload": {}}).decode())
        created = await until(ws, ServerEvent.SESSION_CREATED)
        print(f"ACTIVE {created['session_id']}", flush=True)
        reader = None if no_read else asyncio.create_task(_drain(ws))
        n = 0
        try:
            while reader is None or not reader.done():
                audio = SPEECH if n % 4 == 0 else SILENCE
                event = {"type": ClientEvent.INPUT_APPEND, "input": {"audio": audio}}
                await asyncio.wait_for(ws.send(orjson.dumps(event).decode()), 30)
                n += 1
                await asyncio.sleep(0.3)
        except (ConnectionClosed, OSError, TimeoutError):
            pass
    print("CLOSED", flush=True)


async def _drain(ws: ClientConnection) -> None:
    try:
        while True:
            await ws.recv()
    except ConnectionClosed:
        return


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--mode", default="audio")
    p.add_argument("--no-read", action="store_true")
    args = p.parse_args()
    asyncio.run(run(args.url, args.mode, args.no_read))
    return 0


if __name__ == "__main__":
    sys.exit(main())
