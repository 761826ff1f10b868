"""Real-time duplex clients: each sends one 1 s chunk per second and records every delta it gets.

Used against the real gateway and against the bare baseline server (same protocol, dialect
``current``). A record is ``(t_recv, session_id, kind, input_id, t_emit, dropped_chunks)``;
``t_emit`` is set only by the baseline server, which stamps its frames itself.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import websockets

from api.protocol.events import ClientEvent, ServerEvent
from omnicore.audio import pcm_to_b64

SILENCE_1S = pcm_to_b64(np.zeros(16000, dtype=np.float32))
COMPRESSION: list[str | None] = ["deflate"]  # what clients offer; None: no permessage-deflate
APPEND = orjson.dumps({"type": ClientEvent.INPUT_APPEND, "input": {"audio": SILENCE_1S}}).decode()


@dataclass
class LoadResult:
    """What a run of N clients saw."""

    records: list[tuple[float, str, str, str | None, float | None]] = field(default_factory=list)
    sent: int = 0
    dropped_chunks: int = 0  # sum over sessions of the largest dropped_chunks a delta reported
    errors: list[str] = field(default_factory=list)
    sessions: int = 0
    window: tuple[float, float] = (0.0, 0.0)


async def _session(
    url: str,
    res: LoadResult,
    ready: asyncio.Barrier,
    go: asyncio.Event,
    stop_at: list[float],
    connect_sem: asyncio.Semaphore,
) -> None:
    async with connect_sem:
        ws = await websockets.connect(
            f"{url}/v1/realtime?mode=audio",
            max_size=None,
            open_timeout=60,
            ping_interval=None,
            compression=COMPRESSION[0],
        )
    dropped = 0
    try:
        while True:
            ev = orjson.loads(await asyncio.wait_for(ws.recv(), 120))
            if ev["type"] == ServerEvent.SESSION_QUEUE_DONE:
                break
            if ev["type"] == ServerEvent.ERROR:
                raise RuntimeError(ev["error"]["code"])
        init = {"type": ClientEvent.SESSION_INIT, "payload": {"system_prompt": "bench"}}
        await ws.send(orjson.dumps(init).decode())
        while True:
            ev = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
            if ev["type"] == ServerEvent.SESSION_CREATED:
                sid = ev["session_id"]
                break
            if ev["type"] == ServerEvent.ERROR:
                raise RuntimeError(ev["error"]["code"])
        res.sessions += 1
        await ready.wait()
        await go.wait()

        async def sender() -> None:
            t = time.monotonic() + random.random()  # spread the clients over the second
            while time.monotonic() < stop_at[0]:
                await asyncio.sleep(max(0.0, t - time.monotonic()))
                await ws.send(APPEND)
                res.sent += 1
                t += 1.0

        send_task = asyncio.create_task(sender())
        try:
            while True:
                raw = await asyncio.wait_for(ws.recv(), max(0.5, stop_at[0] + 3 - time.monotonic()))
                t_recv = time.time()
                ev = orjson.loads(raw)
                if ev.get("type") == ServerEvent.RESPONSE_OUTPUT_DELTA:
                    m = ev.get("metrics") or {}
                    dropped = max(dropped, int(m.get("dropped_chunks") or 0))
                    res.records.append(
                        (t_recv, sid, ev["kind"], ev.get("input_id"), ev.get("t_emit"))
                    )
                elif ev.get("type") == ServerEvent.ERROR:
                    res.errors.append(ev["error"]["code"])
                elif ev.get("type") == ServerEvent.SESSION_CLOSED:
                    break
        except TimeoutError:
            pass
        finally:
            send_task.cancel()
        await ws.send(
            orjson.dumps({"type": ClientEvent.SESSION_CLOSE, "reason": "user_stop"}).decode()
        )
        try:
            while True:
                ev = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
                if ev.get("type") == ServerEvent.SESSION_CLOSED:
                    break
        except (TimeoutError, websockets.ConnectionClosed):
            pass
    finally:
        res.dropped_chunks += dropped
        await ws.close()


async def run_load(
    url: str,
    n: int,
    seconds: float,
    warmup: float = 2.0,
    started: asyncio.Event | None = None,
) -> LoadResult:
    """Start ``n`` sessions and stream for ``warmup + seconds``; keep the last ``seconds``
    (``started`` is set when the streaming begins, the warmup's start)."""
    res = LoadResult()
    ready = asyncio.Barrier(n + 1)
    go = asyncio.Event()
    stop_at = [float("inf")]
    sem = asyncio.Semaphore(64)
    tasks = [asyncio.create_task(_session(url, res, ready, go, stop_at, sem)) for _ in range(n)]
    waiter = asyncio.create_task(ready.wait())
    deadline = time.monotonic() + 30 + 0.1 * n
    failed: list[asyncio.Task[None]] = []
    while not waiter.done() and not failed and time.monotonic() < deadline:
        await asyncio.wait([waiter, *tasks], timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        failed = [t for t in tasks if t.done() and t.exception()]
    if failed or not waiter.done():
        for t in tasks:
            t.cancel()
        waiter.cancel()
        await asyncio.wait(tasks, timeout=15)
        exc = failed[0].exception() if failed else TimeoutError("sessions did not start")
        res.errors.append(f"start: {exc!r}")
        return res
    t0 = time.monotonic()
    stop_at[0] = t0 + warmup + seconds
    go.set()
    if started is not None:
        started.set()
    wall0 = time.time()
    res.window = (wall0 + warmup, wall0 + warmup + seconds)
    _, pending = await asyncio.wait(tasks, timeout=warmup + seconds + 30)
    for t in pending:
        t.cancel()
        res.errors.append("session: did not finish")
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception():
            res.errors.append(f"session: {t.exception()!r}")
    return res


def in_window(res: LoadResult) -> list[tuple[Any, ...]]:
    """The records received inside the measurement window."""
    a, b = res.window
    return [r for r in res.records if a <= r[0] <= b]
