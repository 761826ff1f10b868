"""Wait estimates against actual waits, on a mixed chat + duplex workload: ``python -m bench
queue-estimate``.

    python -m bench queue-estimate [--seconds 90] [--slots 2] [--rate 0.4] [--seed 1] [--json]

One gateway and one scripted worker with few slots on the benchmark's private Redis. Clients
arrive at random (Poisson, ``--rate`` per second, seeded) for ``--seconds``: chat turns (one
turn of 10-20 words at 0.1 s a word, so 1-2 s), audio sessions holding their slot 6-12 s after
``session.created`` and video sessions 3-7 s (uniform; the duplex clients send no input, with
the idle timeout off). A warm-up of one session of each mode (drawn alike) gives the moving
averages a first figure. Each queued client keeps its first estimate (``estimated_wait_s`` of
``session.queued`` / ``response.queued``) and its actual wait (from that event to
``session.queue_done`` / ``response.queue_done``). Printed: the median and p90 of the relative
error |estimate - wait| / wait (the wait counted as 1 s at least: estimates are whole seconds),
and, from the same Redis state when each client was queued, what one mean of all holds would
have said (ceil(position / slots) × ``ema_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
import websockets

from api.protocol.events import ClientEvent, ServerEvent
from bench.stack import Stack, install_cleanup, kill_all, shared_redis

TOKEN_DELAY_S = 0.1
CHAT_WORDS = (10, 20)
HOLD_S = {"audio": (6.0, 12.0), "video": (3.0, 7.0)}
MIX = (("chat", 0.5), ("audio", 0.3), ("video", 0.2))
TARGET = 0.25  # the median relative error the estimate is meant to stay within


@dataclass
class Sample:
    """One queued client: its first estimate, its actual wait, and the global-mean estimate."""

    mode: str
    position: int
    estimate_s: int
    waited_s: float
    global_mean_s: float


class Client:
    """One client of the workload: waits in the queue (if it must), then holds its slot."""

    def __init__(self, url: str, stats: aioredis.Redis, stack: Stack) -> None:
        self.url = url
        self.stats = stats
        self.stack = stack

    async def _global_mean(self, position: int) -> float:
        ema = await self.stats.hget(self.stack.keys.duration_stats, "ema_s")
        return math.ceil(position / self.stack.slots) * (float(ema) if ema else 30.0)

    async def _recv(self, ws: websockets.ClientConnection) -> dict[str, Any]:
        ev: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 120))
        if ev["type"] == ServerEvent.ERROR:
            raise RuntimeError(f"error event: {ev.get('error')}")
        return ev

    async def _wait(
        self, ws: websockets.ClientConnection, mode: str, prefix: str, *until: str
    ) -> tuple[Sample | None, str]:
        """Receive up to one of ``until``; the sample when a ``<prefix>.queued`` came first,
        and the type of the last event."""
        queued: tuple[float, dict[str, Any], float] | None = None
        while True:
            ev = await self._recv(ws)
            if ev["type"] == f"{prefix}.queued" and queued is None:
                at = time.monotonic()
                queued = (at, ev, await self._global_mean(int(ev["position"])))
            elif ev["type"] in until:
                break
        if queued is None:
            return None, ev["type"]
        at, ev, mean = queued
        waited = time.monotonic() - at
        sample = Sample(mode, int(ev["position"]), int(ev["estimated_wait_s"]), waited, mean)
        return sample, ev["type"]

    async def chat(self, words: int) -> Sample | None:
        async with websockets.connect(f"{self.url}/v1/realtime?mode=chat", max_size=None) as ws:
            await self._until(ws, ServerEvent.SESSION_QUEUE_DONE)
            await ws.send(orjson.dumps({"type": ClientEvent.SESSION_INIT, "payload": {}}).decode())
            await self._until(ws, ServerEvent.SESSION_CREATED)
            text = "Reply with exactly: " + " ".join(["word"] * words)
            turn = {"messages": [{"role": "user", "content": text}]}
            await ws.send(orjson.dumps({"type": ClientEvent.INPUT_APPEND, "input": turn}).decode())
            # a turn served at once hears no response.queue_done
            sample, last = await self._wait(
                ws,
                "chat",
                "response",
                ServerEvent.RESPONSE_QUEUE_DONE,
                ServerEvent.RESPONSE_OUTPUT_DELTA,
                ServerEvent.RESPONSE_DONE,
            )
            if last != ServerEvent.RESPONSE_DONE:
                await self._until(ws, ServerEvent.RESPONSE_DONE)
            return sample

    async def duplex(self, mode: str, hold_s: float) -> Sample | None:
        async with websockets.connect(f"{self.url}/v1/realtime?mode={mode}", max_size=None) as ws:
            # sent at once (kept until the slot comes): a first event lets the queue events go
            # out as they happen, not held for a resume
            await ws.send(orjson.dumps({"type": ClientEvent.SESSION_INIT, "payload": {}}).decode())
            sample, _ = await self._wait(ws, mode, "session", ServerEvent.SESSION_QUEUE_DONE)
            await self._until(ws, ServerEvent.SESSION_CREATED)
            await asyncio.sleep(hold_s)
            close = {"type": ClientEvent.SESSION_CLOSE, "reason": "user_stop"}
            await ws.send(orjson.dumps(close).decode())
            await self._until(ws, ServerEvent.SESSION_CLOSED)
            return sample

    async def _until(self, ws: websockets.ClientConnection, kind: str) -> None:
        while (await self._recv(ws))["type"] != kind:
            pass


def _draw(rng: random.Random, mode: str) -> float:
    if mode == "chat":
        return rng.randint(*CHAT_WORDS)
    return rng.uniform(*HOLD_S[mode])


async def _one(client: Client, mode: str, size: float) -> Sample | None:
    if mode == "chat":
        return await client.chat(int(size))
    return await client.duplex(mode, size)


def _errors(samples: list[Sample], estimate: str) -> list[float]:
    return [abs(getattr(s, estimate) - s.waited_s) / max(1.0, s.waited_s) for s in samples]


def _summary(errors: list[float]) -> dict[str, float | None]:
    if not errors:
        return {"median": None, "p90": None}
    ranked = sorted(errors)
    p90 = ranked[min(len(ranked) - 1, round(0.9 * (len(ranked) - 1)))]
    return {"median": round(statistics.median(ranked), 3), "p90": round(p90, 3)}


async def workload(stack: Stack, seconds: float, rate: float, seed: int) -> dict[str, Any]:
    """The warm-up, then the random arrivals; every client's sample."""
    rng = random.Random(seed)
    stats = aioredis.Redis.from_url(stack.redis_url)
    client = Client(stack.url, stats, stack)
    try:
        await asyncio.gather(*(_one(client, m, _draw(rng, m)) for m, _ in MIX))
        modes = [m for m, _ in MIX]
        weights = [w for _, w in MIX]
        tasks: list[asyncio.Task[Sample | None]] = []
        began = time.monotonic()
        at = rng.expovariate(rate)
        while at < seconds:
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            mode = rng.choices(modes, weights)[0]
            tasks.append(asyncio.create_task(_one(client, mode, _draw(rng, mode))))
            at += rng.expovariate(rate)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        means = await stats.hgetall(stack.keys.duration_stats)
    finally:
        await stats.aclose()
    failed = [repr(r) for r in results if isinstance(r, BaseException)]
    samples = [r for r in results if isinstance(r, Sample)]
    return {
        "clients": len(tasks),
        "queued": len(samples),
        "failed": failed,
        "samples": [asdict(s) for s in samples],
        "per_mode_estimate": _summary(_errors(samples, "estimate_s")),
        "global_mean_estimate": _summary(_errors(samples, "global_mean_s")),
        "queued_by_mode": {m: sum(s.mode == m for s in samples) for m in modes},
        "mean_hold_s": {_text(k): float(v) for k, v in means.items()},
    }


def measure(seconds: float, slots: int, rate: float, seed: int) -> dict[str, Any]:
    """One run on a fresh stack."""
    stack = Stack(shared_redis(), env={"OMNISERVE_CLIENT_IDLE_TIMEOUT_S": "0"})
    try:
        stack.start_gateway()
        stack.start_worker(slots, orjson.dumps({"token_delay_s": TOKEN_DELAY_S}).decode())
        out = asyncio.run(workload(stack, seconds, rate, seed))
    finally:
        stack.stop()
    return {"seconds": seconds, "slots": slots, "rate_per_s": rate, "seed": seed, **out}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench queue-estimate", description=__doc__.splitlines()[0]
    )
    p.add_argument("--seconds", type=float, default=90.0, help="arrivals for this long")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--rate", type=float, default=0.4, help="client arrivals per second")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    install_cleanup()
    t0 = time.perf_counter()
    try:
        out = measure(args.seconds, args.slots, args.rate, args.seed)
    finally:
        kill_all()
    out["elapsed_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(orjson.dumps(out).decode())
    else:
        est, old = out["per_mode_estimate"], out["global_mean_estimate"]
        print(
            f"queue estimate: {out['queued']} of {out['clients']} clients queued "
            f"{out['queued_by_mode']}, {args.slots} slots, {args.seconds:g} s of arrivals "
            f"at {args.rate:g}/s ({out['elapsed_s']} s)"
        )
        print(f"  per-mode estimate   median |error| {_pct(est['median'])}  p90 {_pct(est['p90'])}")
        print(f"  one global mean     median |error| {_pct(old['median'])}  p90 {_pct(old['p90'])}")
        for line in out["failed"]:
            print(f"  failed client: {line}")
    median = out["per_mode_estimate"]["median"]
    return 0 if median is not None and median <= TARGET and not out["failed"] else 1


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"
