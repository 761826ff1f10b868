"""``python -m bench soak --minutes N``: many short and long sessions under random faults.

A whole deployment on loopback (its own Redis server that may be killed and started again empty,
two gateways, a threads worker with two slots and a prefork worker with one) serves clients that
open short and long duplex sessions, chat turns, and sessions they leave at a random moment,
while a fault is caused every few seconds: kill -9 of a worker, of a prefork pool process, of a
gateway, of Redis; a client frozen with SIGSTOP; a client that never reads. At the end the load
stops and the pool must come back to full.

Every session ends in one of these ways, counted from what its client saw:

- ``closed``: ``session.closed`` (any reason), or the chat turns answered and closed;
- ``refused``: an ``error`` and a close code (``service_unavailable`` while Redis is away, ...);
- ``cut``: the TCP connection dropped because its gateway was killed (nothing could tell it);
- ``left``: the client itself left (the "leave at a random phase" sessions);
- ``lost``: anything else: closed with no closing event, or silent past ``STUCK_S``. Must be 0.

Printed: sessions served, faults injected by kind, slots leaked (must be 0), sessions lost
(must be 0), and the memory of the gateway that is never killed, before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import websockets
from websockets.exceptions import ConnectionClosed

from api.protocol.events import ClientEvent, ServerEvent
from bench.soak_stack import SoakStack
from bench.stack import install_cleanup, stop
from omnicore.audio import pcm_to_b64

STUCK_S = 45.0  # a client that hears nothing for this long while it waits for something is lost
_T = np.arange(16000) / 16000
SPEECH = pcm_to_b64((0.2 * np.sin(2 * np.pi * 220 * _T)).astype(np.float32))
SILENCE = pcm_to_b64(np.zeros(16000, dtype=np.float32))
FAULTS = ("kill_worker", "kill_pool_process", "kill_gateway", "restart_redis", "frozen_client",
          "never_reading_client")  # fmt: skip


# --------------------------------------------------------------------------- the clients


@dataclass
class Tally:
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    lost: list[str] = field(default_factory=list)


class Session:
    """One client session; ``run`` returns how it ended (see the module docstring)."""

    def __init__(self, stack: SoakStack, gw: int, kind: str, rng: random.Random) -> None:
        self.stack, self.gw, self.kind, self.rng = stack, gw, kind, rng
        self.epoch = stack.gateway_epoch[gw]
        self.frames: list[dict[str, Any]] = []
        self.reason: str | None = None
        self.lost_detail = ""

    async def run(self) -> str:
        mode = "chat" if self.kind == "chat" else "audio"
        url = f"{self.stack.url(self.gw)}/v1/realtime?mode={mode}"
        try:
            async with websockets.connect(url, max_size=None, open_timeout=10) as ws:
                return await asyncio.wait_for(self._talk(ws), 300)
        except ConnectionClosed as exc:
            return self._ended(exc.rcvd.code if exc.rcvd else None)
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            if self.stack.gateway_epoch[self.gw] != self.epoch:
                return "cut"
            if isinstance(exc, TimeoutError) and self.frames:
                return self._lost("silent for too long")
            return "refused"  # could not connect (a gateway restarting): the client knows

    def _ended(self, code: int | None) -> str:
        if self.reason is not None:
            return "closed"
        if any(f.get("type") == ServerEvent.ERROR for f in self.frames) and code not in (
            None,
            1006,
        ):
            return "refused"
        if self.stack.gateway_epoch[self.gw] != self.epoch:
            return "cut"
        return self._lost(f"connection ended ({code}) without a closing event")

    def _lost(self, why: str) -> str:
        kinds = [f.get("type") for f in self.frames[-6:]]
        self.lost_detail = f"{self.kind} on gateway {self.gw}: {why}; last frames {kinds}"
        return "lost"

    async def _recv(self, ws: Any, *types: str) -> dict[str, Any]:
        while True:
            frame: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), STUCK_S))
            self.frames.append(frame)
            if frame.get("type") == ServerEvent.SESSION_CLOSED:
                self.reason = str(frame.get("reason"))
            if frame.get("type") in types or frame.get("type") == ServerEvent.SESSION_CLOSED:
                return frame

    async def _talk(self, ws: Any) -> str:
        rng = self.rng
        await self._recv(ws, ServerEvent.SESSION_QUEUE_DONE)
        if self.reason:
            return "closed"
        leave_at = rng.choice(["queue_done", "init", "stream"]) if self.kind == "leave" else ""
        if leave_at == "queue_done":
            ws.transport.abort()
            return "left"
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_INIT, "payload": {}}).decode())
        if leave_at == "init":
            ws.transport.abort()
            return "left"
        if (await self._recv(ws, ServerEvent.SESSION_CREATED))[
            "type"
        ] == ServerEvent.SESSION_CLOSED:
            return "closed"
        if self.kind == "chat":
            return await self._chat(ws)
        chunks = {"short": rng.randint(2, 5), "long": rng.randint(20, 40)}.get(self.kind, 8)
        reader = asyncio.create_task(self._recv(ws))  # until session.closed
        for n in range(chunks):
            if reader.done():
                break
            audio = SPEECH if n % 4 == 0 else SILENCE
            event = {"type": ClientEvent.INPUT_APPEND, "input": {"audio": audio}}
            await ws.send(orjson.dumps(event).decode())
            await asyncio.sleep(0.3)
            if leave_at == "stream" and n == chunks // 2:
                reader.cancel()
                ws.transport.abort()
                return "left"
        if not reader.done():
            await ws.send(orjson.dumps({"type": ClientEvent.SESSION_CLOSE}).decode())
        await reader
        return "closed"

    async def _chat(self, ws: Any) -> str:
        for _ in range(self.rng.randint(1, 2)):
            turn = {"messages": [{"role": "user", "content": "hello"}]}
            await ws.send(orjson.dumps({"type": ClientEvent.INPUT_APPEND, "input": turn}).decode())
            frame = await self._recv(ws, ServerEvent.RESPONSE_DONE, ServerEvent.ERROR)
            if frame["type"] == ServerEvent.SESSION_CLOSED:
                return "closed"
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_CLOSE}).decode())
        await self._recv(ws)
        return "closed"


async def client_loop(stack: SoakStack, tally: Tally, until: float, seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        kind = rng.choices(["short", "long", "chat", "leave"], [4, 2, 3, 2])[0]
        s = Session(stack, rng.randrange(2), kind, rng)
        outcome = await s.run()
        tally.outcomes[outcome] += 1
        if s.reason:
            tally.reasons[s.reason] += 1
        if outcome == "lost":
            tally.lost.append(s.lost_detail)
        if outcome in ("refused", "cut"):
            await asyncio.sleep(rng.uniform(0.2, 1.0))  # as a client would before retrying


async def fault_loop(
    stack: SoakStack, tally: Tally, until: float, rng: random.Random, every: float
) -> None:
    pending: list[tuple[float, subprocess.Popen[bytes]]] = []
    deck: list[str] = []  # every kind once, in a random order, then again
    while time.monotonic() < until - every / 2:
        await asyncio.sleep(rng.uniform(0.5 * every, 1.5 * every))
        if not deck:
            deck = rng.sample(FAULTS, len(FAULTS))
        kind = deck.pop()
        if kind in ("frozen_client", "never_reading_client"):
            p = stack.fault_client(rng, no_read=kind == "never_reading_client")
            if kind == "frozen_client":
                await asyncio.sleep(rng.uniform(2, 4))
                os.kill(p.pid, signal.SIGSTOP)
            pending.append((time.monotonic() + 20, p))
            what = f"client process {p.pid}"
        else:
            what = await asyncio.to_thread(getattr(stack, kind), rng)
        tally.faults[kind] += 1
        print(f"  soak: fault {kind}: {what}", flush=True)
        for t, p in list(pending):
            if time.monotonic() > t:
                os.killpg(p.pid, signal.SIGCONT)
                stop(p, timeout=1)
                pending.remove((t, p))
    for _, p in pending:
        os.killpg(p.pid, signal.SIGCONT)
        stop(p, timeout=1)


# --------------------------------------------------------------------------- the run


async def soak(minutes: float, clients: int, fault_every: float, seed: int) -> dict[str, Any]:
    stack = SoakStack()
    tally = Tally()
    rng = random.Random(seed)
    try:
        await asyncio.to_thread(stack.start)
        rss_before = stack.gateway_rss_mib()
        until = time.monotonic() + minutes * 60
        loops = [client_loop(stack, tally, until, seed * 1000 + i) for i in range(clients)]
        await asyncio.gather(fault_loop(stack, tally, until, rng, fault_every), *loops)
        full = await asyncio.to_thread(stack.wait_pool_full, 60)
        pool, queue = stack.pool(), stack.queue_length()
        rss_after = stack.gateway_rss_mib()
    finally:
        stack.stop()
    served = tally.outcomes["closed"] + tally.outcomes["left"]
    return {
        "minutes": minutes,
        "clients": clients,
        "sessions": sum(tally.outcomes.values()),
        "sessions_served": served,
        "outcomes": dict(tally.outcomes),
        "closed_reasons": dict(tally.reasons),
        "faults_injected": sum(tally.faults.values()),
        "faults": dict(tally.faults),
        "slots_leaked": 0 if full else stack.total_slots - pool["free_live"],
        "pool_at_end": pool,
        "queue_left": queue,
        "sessions_lost": tally.outcomes["lost"],
        "lost": tally.lost[:20],
        "gateway_rss_mib_before": round(rss_before, 1),
        "gateway_rss_mib_after": round(rss_after, 1),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=6, help="concurrent client loops")
    p.add_argument("--fault-every", type=float, default=20.0, help="mean seconds between faults")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    install_cleanup()
    out = asyncio.run(soak(args.minutes, args.clients, args.fault_every, args.seed))
    if args.json:
        print(orjson.dumps(out).decode())
    else:
        print(f"soak: {out['minutes']:g} min, {out['clients']} concurrent clients")
        print(f"  sessions served       {out['sessions_served']} of {out['sessions']}")
        print(f"  outcomes              {out['outcomes']}")
        print(f"  session.closed        {out['closed_reasons']}")
        print(f"  faults injected       {out['faults_injected']} {out['faults']}")
        print(f"  slots leaked          {out['slots_leaked']} (queue left: {out['queue_left']})")
        if out["slots_leaked"]:
            print(f"    pool at the end: {out['pool_at_end']}")
        print(f"  sessions lost         {out['sessions_lost']}")
        for line in out["lost"]:
            print(f"    {line}")
        print(
            f"  gateway memory        {out['gateway_rss_mib_before']} MiB before, "
            f"{out['gateway_rss_mib_after']} MiB after"
        )
    ok = out["slots_leaked"] == 0 and out["sessions_lost"] == 0 and out["queue_left"] == 0
    return 0 if ok else 1
