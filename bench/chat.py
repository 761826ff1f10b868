"""Chat: time to the first text delta and to ``response.done``, short and long answers.

The scripted backend answers "Reply with exactly: X" with X, one word per delta and
``token_delay_s`` (0.01 s) per word, so the long answer's generation alone takes ~2 s. Each
connection runs one uncounted turn first (``WARMUP``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import websockets

from api.protocol.events import ClientEvent, ServerEvent
from bench.report import percentiles

SHORT = " ".join(f"w{i}" for i in range(5))
LONG = " ".join(f"w{i}" for i in range(200))
WARMUP = 1  # turns run before the counted ones (the first pays for warming caches and pools)


async def _turns(url: str, text: str, rounds: int) -> dict[str, Any]:
    ws = await websockets.connect(f"{url}/v1/realtime?mode=chat", max_size=None, ping_interval=None)
    first: list[float] = []
    done: list[float] = []
    try:
        while (
            orjson.loads(await asyncio.wait_for(ws.recv(), 30))["type"]
            != ServerEvent.SESSION_QUEUE_DONE
        ):
            pass
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_INIT, "payload": {}}).decode())
        while (
            orjson.loads(await asyncio.wait_for(ws.recv(), 30))["type"]
            != ServerEvent.SESSION_CREATED
        ):
            pass
        msg = orjson.dumps(
            {
                "type": ClientEvent.INPUT_APPEND,
                "input": {
                    "messages": [{"role": "user", "content": f"Reply with exactly: {text}"}],
                    "streaming": True,
                    "generation": {"max_new_tokens": 512},
                    "tts": {"enabled": False},
                },
            }
        ).decode()
        for i in range(WARMUP + rounds):
            if i == WARMUP:  # the connection's first turns are not counted
                first.clear()
                done.clear()
            t0 = time.perf_counter()
            await ws.send(msg)
            t_first = None
            while True:
                ev = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
                if ev["type"] == ServerEvent.RESPONSE_OUTPUT_DELTA and t_first is None:
                    t_first = time.perf_counter()
                elif ev["type"] == ServerEvent.RESPONSE_DONE:
                    done.append((time.perf_counter() - t0) * 1000)
                    first.append(((t_first or time.perf_counter()) - t0) * 1000)
                    break
                elif ev["type"] == ServerEvent.ERROR:
                    raise RuntimeError(ev["error"])
    finally:
        await ws.close()
    return {"rounds": rounds, "first_delta_ms": percentiles(first), "done_ms": percentiles(done)}


def measure(url: str, short_rounds: int, long_rounds: int) -> dict[str, Any]:
    """Sequential turns in one session, short then long."""
    return {
        "short_5_words": asyncio.run(_turns(url, SHORT, short_rounds)),
        "long_200_words": asyncio.run(_turns(url, LONG, long_rounds)),
    }
