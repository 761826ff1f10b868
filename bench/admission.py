"""Admission: slot-free -> next client's ``session.queue_done``; cost of queue position updates.

- handoff: one worker slot, a few clients waiting; the holder closes, the tap stamps the
  ``release`` published by the RELEASE Lua script, the next client stamps its queue_done.
- updates: N waiting clients, the head leaving once per second (every position shifts), the
  gateway's periodic refresh (``queue_update_interval_s``, default 3 s) on top. Measured: updates
  delivered per second and Redis commands per update (INFO commandstats deltas).
  ``ws``: real WebSockets to a gateway process. ``direct``: the gateway's own QueueManager,
  Admission and OutputBus classes in this process against the real Redis, with in-memory
  clients (used for 10,000 waiters: too many sockets for a 2-core box).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import orjson
import psutil
import redis
import redis.asyncio as aioredis
import websockets

from api.protocol.events import ClientEvent, ServerEvent
from bench.report import percentiles
from bench.stack import Stack
from bench.tap import Tap


def _commands(url: str) -> int:
    """Total commands Redis has executed (INFO commandstats)."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


# --------------------------------------------------------------------------- handoff


async def _until(ws: websockets.ClientConnection, kind: str, timeout: float = 30) -> float:
    while True:
        ev = orjson.loads(await asyncio.wait_for(ws.recv(), timeout))
        if ev["type"] == kind:
            return time.time()
        if ev["type"] == ServerEvent.ERROR:
            raise RuntimeError(ev["error"])


async def _connect(url: str) -> websockets.ClientConnection:
    return await websockets.connect(f"{url}/v1/realtime?mode=audio", ping_interval=None)


async def _handoff(url: str, rounds: int, waiting: int) -> list[float]:
    holder = await _connect(url)
    await _until(holder, ServerEvent.SESSION_QUEUE_DONE)
    queue = []
    for _ in range(waiting):
        ws = await _connect(url)
        await _until(ws, ServerEvent.SESSION_QUEUED)
        queue.append(ws)
    done_at: list[float] = []
    for _ in range(rounds):
        await holder.send(
            orjson.dumps({"type": ClientEvent.SESSION_CLOSE, "reason": "user_stop"}).decode()
        )
        nxt = queue.pop(0)
        done_at.append(await _until(nxt, ServerEvent.SESSION_QUEUE_DONE))
        await holder.close()
        holder = nxt
        ws = await _connect(url)
        await _until(ws, ServerEvent.SESSION_QUEUED)
        queue.append(ws)
        await asyncio.sleep(0.3)  # let the queue settle: each round is measured alone
    for ws in [holder, *queue]:
        await ws.close()
    return done_at


def handoff(stack: Stack, rounds: int, waiting: int = 3) -> dict[str, Any]:
    """Slot released (Redis publish) -> next waiting client has session.queue_done."""
    from bench.relay import TAP_DIR

    TAP_DIR.mkdir(parents=True, exist_ok=True)
    with Tap(stack.redis_url, stack.prefix, TAP_DIR / f"{stack.prefix}-q.jsonl") as tap:
        done_at = asyncio.run(_handoff(stack.url, rounds, waiting))
        time.sleep(0.2)
    releases = sorted(r[0] for r in tap.rows() if r[1] == "queue" and r[2] == "release")
    lat = []
    for t in done_at:
        before = [x for x in releases if x <= t]
        if before:
            lat.append((t - before[-1]) * 1000)
    return {"rounds": rounds, "matched": len(lat), "slot_free_to_queue_done_ms": percentiles(lat)}


# ------------------------------------------------------------------------ updates over WebSockets


async def _ws_updates(
    url: str, n: int, seconds: float, probe: Any
) -> tuple[dict[str, Any], tuple[int, float], tuple[int, float]]:
    counts = {"updates": 0}
    positions: dict[int, int] = {}
    rejected: list[str] = []
    update_first: list[int] = []
    socks: dict[int, websockets.ClientConnection] = {}

    async def client(i: int, sem: asyncio.Semaphore, ready: asyncio.Event) -> None:
        async with sem:
            ws = await websockets.connect(
                f"{url}/v1/realtime?mode=audio", ping_interval=None, open_timeout=60
            )
            socks[i] = ws
            first = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
            if first.get("type") in (ServerEvent.SESSION_QUEUED, ServerEvent.SESSION_QUEUE_UPDATE):
                positions[i] = int(first["position"])
                if first["type"] != ServerEvent.SESSION_QUEUED:
                    update_first.append(i)  # protocol order: queued must come first
            else:
                rejected.append(str((first.get("error") or {}).get("code")))
        if len(positions) + len(rejected) == n:
            ready.set()
        try:
            async for raw in ws:
                ev = orjson.loads(raw)
                if ev["type"] == ServerEvent.SESSION_QUEUE_UPDATE:
                    counts["updates"] += 1
                    positions[i] = int(ev["position"])
        except websockets.ConnectionClosed:
            pass

    holder = await _connect(url)  # takes the only slot, so everyone else waits
    await _until(holder, ServerEvent.SESSION_QUEUE_DONE)
    # 20 connects in flight: more trips the gateway's Redis pool limit (see docs/BENCHMARKS.md)
    sem, ready = asyncio.Semaphore(20), asyncio.Event()
    t_fill = time.perf_counter()
    tasks = [asyncio.create_task(client(i, sem, ready)) for i in range(n)]
    await asyncio.wait_for(ready.wait(), 120)
    fill_s = time.perf_counter() - t_fill
    await asyncio.sleep(1.0)
    counts["updates"] = 0
    before = probe()
    t0 = time.perf_counter()
    left = 0
    while time.perf_counter() - t0 < seconds:
        await asyncio.sleep(1.0)
        head = min(positions, key=lambda k: positions[k])
        positions.pop(head)
        await socks.pop(head).close()
        left += 1
    elapsed = time.perf_counter() - t0
    updates = counts["updates"]
    after = probe()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(ws.close() for ws in socks.values()), return_exceptions=True)
    await holder.close()
    return (
        {
            "fill_s": round(fill_s, 2),
            "updates": updates,
            "seconds": round(elapsed, 2),
            "leaves": left,
            "rejected": len(rejected),
            "rejected_codes": sorted(set(rejected)),
            "queue_update_before_queued": len(update_first),
        },
        before,
        after,
    )


def updates_ws(stack: Stack, n: int, seconds: float) -> dict[str, Any]:
    """N real WebSockets waiting at a gateway whose one worker slot is held by another client."""
    assert stack.gateway is not None
    gw = psutil.Process(stack.gateway.pid)

    def probe() -> tuple[int, float]:
        return _commands(stack.redis_url), sum(gw.cpu_times()[:2])

    out, (c0, ct0), (c1, ct1) = asyncio.run(_ws_updates(stack.url, n, seconds, probe))
    return _rates("ws", n, out, c1 - c0, ct1 - ct0, note="gateway process CPU")


def _rates(
    how: str, n: int, out: dict[str, Any], commands: int, cpu_s: float, note: str = ""
) -> dict[str, Any]:
    ups = out["updates"]
    return {
        "driver": how,
        "waiting": n,
        **out,
        "updates_per_s": round(ups / out["seconds"], 1),
        "redis_commands": commands,
        "redis_commands_per_update": round(commands / ups, 4) if ups else None,
        "gateway_cpu_s": round(cpu_s, 2),
        "gateway_cpu_ms_per_update": round(cpu_s * 1000 / ups, 4) if ups else None,
        "note": note,
    }


# --------------------------------------------------------------------------- updates, direct


async def _direct(url: str, n: int, seconds: float, interval_s: float) -> dict[str, Any]:
    from api.gateway.queueing import QueueManager, Waiter
    from streaming.admission import Admission
    from streaming.keys import Keys
    from streaming.output import OutputBus

    keys = Keys("bq" + uuid.uuid4().hex[:6])
    r = aioredis.Redis.from_url(url)
    gw_id = uuid.uuid4().hex[:10]
    await r.set(keys.gateway_alive(gw_id), b"1", ex=3600)
    adm = Admission(r, keys)
    qm = QueueManager(adm, gw_id, max_queue=n + 10, update_interval_s=interval_s)
    counts = {"updates": 0}

    async def notify(_frame: dict[str, Any]) -> None:
        counts["updates"] += 1

    loop = asyncio.get_running_loop()
    t_fill = time.perf_counter()
    tickets = []
    for _ in range(n):  # enqueue as acquire() does, without its per-join snapshot (O(n) each)
        ticket = qm.new_ticket_id()
        qm.waiters[ticket] = Waiter(ticket, notify, loop.create_future(), last_position=0)
        tickets.append(ticket)
    for i in range(0, n, 50):  # < 100 in flight: redis-py 8's async pool caps at 100 connections
        await asyncio.gather(*(adm.enqueue(t, n + 10) for t in tickets[i : i + 50]))
    fill_s = time.perf_counter() - t_fill
    bus = OutputBus(r, keys, on_queue_event=qm.on_event)
    await bus.start()
    await qm.start()
    await asyncio.sleep(1.5)
    proc = psutil.Process()
    c0, ct0 = _commands(url), sum(proc.cpu_times()[:2])
    counts["updates"] = 0
    t0 = time.perf_counter()
    left = 0
    while time.perf_counter() - t0 < seconds:
        await asyncio.sleep(1.0)
        head = tickets.pop(0)
        qm.waiters.pop(head, None)
        await adm.leave(head)
        left += 1
    elapsed = time.perf_counter() - t0
    updates = counts["updates"]
    c1, ct1 = _commands(url), sum(proc.cpu_times()[:2])
    await qm.stop()
    await bus.stop()
    keys_left = [k async for k in r.scan_iter(f"{keys.prefix}:*", count=1000)]
    if keys_left:
        await r.delete(*keys_left)
    await r.aclose()
    out = {
        "fill_s": round(fill_s, 2),
        "updates": updates,
        "seconds": round(elapsed, 2),
        "leaves": left,
    }
    return _rates(
        "direct",
        n,
        out,
        c1 - c0,
        ct1 - ct0,
        note="QueueManager in the bench process; CPU is that process's",
    )


def updates_direct(
    redis_url: str, n: int, seconds: float, interval_s: float = 3.0
) -> dict[str, Any]:
    """N in-memory waiters on the real QueueManager + Admission + Redis."""
    return asyncio.run(_direct(redis_url, n, seconds, interval_s))
