"""Relay overhead: worker emit -> client receive for every duplex delta, at a given concurrency.

Through the stack, "worker emit" is the Redis publish as stamped by the tap process (bench/tap.py);
for the baseline it is the server's own stamp in the frame. Both clocks are this machine's wall
clock, so the difference is the delivery time the client sees.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from bench.duplex_load import LoadResult, in_window, run_load
from bench.procstats import Sampler
from bench.report import percentiles
from bench.stack import Stack, redis_pid
from bench.tap import Tap
from streaming.events import Listen, Speak, tag

STEP_EVENTS = {tag(Speak), tag(Listen)}  # the worker events that answer one input chunk

TAP_DIR = Path("/tmp/omniserve-bench-tap")


def _emit_times(rows: list[list[Any]]) -> dict[tuple[str, str], float]:
    """(session_id, input_id) -> publish time of the worker event answering that input."""
    out: dict[tuple[str, str], float] = {}
    for row in rows:
        if len(row) == 5 and row[2] in STEP_EVENTS and row[3]:
            out.setdefault((row[1], row[3]), row[0])
    return out


def _summary(
    n: int, res: LoadResult, lat: list[tuple[str, float]], unmatched: int
) -> dict[str, Any]:
    a, b = res.window
    lat_ms = [x[1] for x in lat]
    return {
        "sessions": n,
        "sessions_started": res.sessions,
        "deltas": len(lat_ms),
        "deltas_per_s": round(len(lat_ms) / max(1e-9, b - a), 1),
        "unmatched": unmatched,
        "dropped_chunks": res.dropped_chunks,
        "errors": len(res.errors),
        "error_samples": res.errors[:3],
        "latency_ms": percentiles(lat_ms),
        "latency_ms_by_kind": {
            k: percentiles([x[1] for x in lat if x[0] == k]) for k in sorted({x[0] for x in lat})
        },
    }


def stack_level(stack: Stack, n: int, seconds: float, warmup: float) -> dict[str, Any]:
    """n real-time sessions through gateway + Redis + worker; latency, drops, gateway CPU/RSS."""
    TAP_DIR.mkdir(parents=True, exist_ok=True)
    assert stack.gateway is not None
    pids = {"gateway": stack.gateway.pid, "redis": redis_pid(), "bench": os.getpid()}
    pids.update({f"worker{i}": w.pid for i, w in enumerate(stack.workers)})
    stack.wait_free(stack.slots, timeout=30)
    with (
        Sampler(pids) as sampler,
        Tap(stack.redis_url, stack.prefix, TAP_DIR / f"{stack.prefix}-{n}.jsonl") as tap,
    ):
        idle = sampler  # samples before the load starts give the idle RSS
        res = asyncio.run(run_load(stack.url, n, seconds, warmup))
    rows = tap.rows()
    emit = _emit_times(rows)
    lat, unmatched = [], 0
    for t_recv, sid, kind, input_id, _ in in_window(res):
        t = emit.get((sid, input_id))
        if t is None:
            unmatched += 1
        else:
            lat.append((kind, (t_recv - t) * 1000))
    out = _summary(n, res, lat, unmatched)
    a, b = res.window
    procs = {name: sampler.window(name, a, b) for name in pids}
    workers = [v for k, v in procs.items() if k.startswith("worker")]
    out["procs"] = {k: v for k, v in procs.items() if not k.startswith("worker")}
    out["procs"]["workers"] = {
        "count": len(workers),
        "cpu_pct": round(sum(w["cpu_pct"] for w in workers), 1),
        "rss_mib": round(sum(w["rss_mib"] for w in workers), 1),
    }
    gw_samples = idle.samples.get("gateway") or [(0, 0, 0)]
    out["gateway_idle_rss_mib"] = round(stack.gateway_idle_rss_mib or gw_samples[0][2] / 2**20, 1)
    gw = out["procs"]["gateway"]
    out["gateway_cpu_pct_per_session"] = round(gw["cpu_pct"] / n, 3)
    out["gateway_rss_mib_per_session"] = round(
        max(0.0, gw["rss_mib"] - out["gateway_idle_rss_mib"]) / n, 3
    )
    return out


def baseline_level(
    url: str, n: int, seconds: float, warmup: float, pid: int | None = None
) -> dict[str, Any]:
    """n real-time sessions against the bare in-process server (no Redis, no Celery); with its
    ``pid``, also the server's CPU per session (the same core as the gateway when pinned)."""
    with Sampler({"server": pid} if pid else {}) as sampler:
        res = asyncio.run(run_load(url, n, seconds, warmup))
    lat = [(r[2], (r[0] - r[4]) * 1000) for r in in_window(res) if r[4] is not None]
    out = _summary(n, res, lat, 0)
    if pid:
        server = sampler.window("server", *res.window)
        out["procs"] = {"server": server}
        out["server_cpu_pct_per_session"] = round(server["cpu_pct"] / n, 3)
    return out
