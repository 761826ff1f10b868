"""A call far longer than the context window, on the scripted backend: ``python -m bench
rollover``.

    python -m bench rollover [--minutes 30] [--kv-tokens 0] [--turn-s 20] [--json]

One gateway and one scripted worker (16 tokens per one-second step, about MiniCPM-o's rate
for audio) on the benchmark's private Redis. One audio client sends ``--minutes`` of input in
one-second chunks, each as soon as the previous one is answered (a fast clock: a minute of call
in well under a minute), as a conversation: every ``--turn-s`` seconds of input 3 s of speech
then silence, which the model answers. The worker's rollover settings are the defaults unless
``--kv-tokens`` sets the budget. Printed: the rollovers, any ``context_full`` or error, the
output gap across each rollover (from the answer before it to the answer after it) beside the
gap between two ordinary steps (p50/p99), the rollover's own prepare time, and the worker's
memory (RSS of its processes) at the first rollover and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from typing import Any

import numpy as np
import orjson
import psutil
import websockets

from api.protocol.events import ClientEvent, ServerEvent
from bench.stack import Stack, install_cleanup, kill_all, shared_redis

SPEECH_S = 3
TRANSCRIPT = "my name is Ada and I like long calls"


def chunk(voiced: bool) -> str:
    """One second of 16 kHz float32 audio, base64: a tone, or silence."""
    import base64

    t = np.arange(16000, dtype=np.float32) / 16000
    pcm = (0.2 * np.sin(2 * math.pi * 300 * t)) if voiced else np.zeros(16000)
    return base64.b64encode(pcm.astype(np.float32).tobytes()).decode()


def worker_rss_mib(stack: Stack) -> float:
    """RSS of the worker processes (the node and its pool), MiB."""
    total = 0
    for p in stack.workers:
        proc = psutil.Process(p.pid)
        for q in [proc, *proc.children(recursive=True)]:
            try:
                total += q.memory_info().rss
            except psutil.Error:
                continue
    return total / 2**20


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def call(stack: Stack, seconds: int, turn_s: int) -> dict[str, Any]:
    """One long call; the figures of the module docstring."""
    voiced, quiet = chunk(True), chunk(False)
    async with websockets.connect(f"{stack.url}/v1/realtime?mode=audio", max_size=None) as ws:

        async def until(*types: str) -> dict[str, Any]:
            while True:
                ev: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
                if ev["type"] in types:
                    return ev

        await until(ServerEvent.SESSION_QUEUE_DONE)
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_INIT, "payload": {}}).decode())
        await until(ServerEvent.SESSION_CREATED)
        gaps: list[float] = []  # between consecutive answers, without a rollover
        rollover_gaps: list[float] = []
        prepare_s: list[float] = []
        kv_before: list[int] = []
        kv_after: list[int] = []
        max_kv = 0
        problems: list[dict[str, Any]] = []
        rss: list[float] = []
        last = time.perf_counter()
        for i in range(seconds):
            audio = voiced if i % turn_s < SPEECH_S else quiet
            await ws.send(
                orjson.dumps({"type": ClientEvent.INPUT_APPEND, "input": {"audio": audio}}).decode()
            )
            rolled = False
            while True:
                ev = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
                kind = ev["type"]
                if kind == ServerEvent.SESSION_ROLLOVER:
                    rolled = True
                    prepare_s.append(float(ev["metrics"]["prepare_s"]))
                    kv_before.append(int(ev["metrics"]["kv_cache_length_before"]))
                    kv_after.append(int(ev["kv_cache_length"]))
                    if not rss:
                        rss.append(worker_rss_mib(stack))
                elif kind in (ServerEvent.ERROR, ServerEvent.SESSION_CLOSED):
                    problems.append(ev)
                    if kind == ServerEvent.SESSION_CLOSED:
                        raise RuntimeError(f"the call ended after {i} s: {ev}")
                elif (
                    kind == ServerEvent.RESPONSE_OUTPUT_DELTA and ev["input_id"] == f"input_{i + 1}"
                ):
                    max_kv = max(max_kv, int(ev["metrics"].get("kv_cache_length", 0)))
                    break
            now = time.perf_counter()
            (rollover_gaps if rolled else gaps).append(now - last)
            last = now
        rss.append(worker_rss_mib(stack))
        await ws.send(orjson.dumps({"type": ClientEvent.SESSION_CLOSE}).decode())
        closed = await until(ServerEvent.SESSION_CLOSED)
    ms = 1000.0
    return {
        "call_s": seconds,
        "rollovers": len(rollover_gaps),
        "context_full": closed["reason"] == "context_full"
        or any(p.get("reason") == "context_full" for p in problems),
        "errors": [p for p in problems if p["type"] == ServerEvent.ERROR],
        "max_kv_cache_length": max_kv,
        "kv_before_rollover": kv_before,
        "kv_after_rollover": kv_after,
        "gap_ms": {"p50": round(pct(gaps, 0.5) * ms, 2), "p99": round(pct(gaps, 0.99) * ms, 2)},
        "rollover_gap_ms": {
            "p50": round(pct(rollover_gaps, 0.5) * ms, 2) if rollover_gaps else None,
            "p99": round(pct(rollover_gaps, 0.99) * ms, 2) if rollover_gaps else None,
        },
        "rollover_prepare_ms_median": round(statistics.median(prepare_s) * ms, 2)
        if prepare_s
        else None,
        "worker_rss_mib": {"first_rollover": round(rss[0], 1), "end": round(rss[-1], 1)},
    }


def measure(minutes: float, kv_tokens: int, turn_s: int) -> dict[str, Any]:
    """Start the stack, run the call, stop the stack."""
    env = {
        "OMNISERVE_AUDIO_DURATION_S": str(minutes * 60 * 4 + 600),  # wall time is shorter
        "OMNISERVE_INPUT_MAX_PENDING": "4",
    }
    if kv_tokens:
        env["OMNISERVE_ROLLOVER_KV_TOKENS"] = str(kv_tokens)
    stack = Stack(shared_redis(), env=env)
    try:
        stack.start_worker(1, orjson.dumps({"transcript": TRANSCRIPT}).decode())
        stack.start_gateway()
        return asyncio.run(call(stack, round(minutes * 60), turn_s))
    finally:
        stack.stop()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench rollover", description=__doc__.splitlines()[0]
    )
    p.add_argument("--minutes", type=float, default=30.0, help="minutes of call audio")
    p.add_argument("--kv-tokens", type=int, default=0, help="rollover budget (0: the default)")
    p.add_argument("--turn-s", type=int, default=20, help="seconds between the user's turns")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    install_cleanup()
    t0 = time.perf_counter()
    try:
        out = measure(args.minutes, args.kv_tokens, args.turn_s)
    finally:
        kill_all()
    out["elapsed_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(orjson.dumps(out).decode())
        return 0 if out["rollovers"] and not out["context_full"] else 1
    print(
        f"rollover: a {args.minutes:g}-minute audio call (scripted, {out['elapsed_s']} s wall): "
        f"{out['rollovers']} rollovers, context_full: {out['context_full']}, "
        f"errors: {len(out['errors'])}, largest KV cache {out['max_kv_cache_length']}"
    )
    print(f"  KV at each rollover {out['kv_before_rollover']} -> {out['kv_after_rollover']}")
    g, r = out["gap_ms"], out["rollover_gap_ms"]
    print(f"  output gap, ordinary step   p50 {g['p50']} ms  p99 {g['p99']} ms")
    print(f"  output gap, across rollover p50 {r['p50']} ms  p99 {r['p99']} ms")
    print(f"  rollover prepare (median)   {out['rollover_prepare_ms_median']} ms")
    m = out["worker_rss_mib"]
    print(f"  worker RSS: at the first rollover {m['first_rollover']} MiB, end {m['end']} MiB")
    return 0 if out["rollovers"] and not out["context_full"] else 1
