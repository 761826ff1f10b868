"""Relay overhead: worker emit -> client receive for every duplex delta, at a given concurrency.

Through the stack, two starting points, both the step's first event (its text; the audio that
follows is timed from it, as the baseline times both frames from the step's output): the Redis
publish as stamped by the tap process (bench/tap.py), ``latency_ms``, the gateway's part; and
the worker's own emit stamp in the event, ``emit_latency_ms``, the whole relay (the worker's
write to Redis included). For the baseline it is the server's own stamp in the frame. All
clocks are this machine's wall clock, so the difference is the delivery time the client sees.
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


def _emit_times(rows: list[list[Any]], column: int = 0) -> dict[tuple[str, str], float]:
    """(session_id, input_id) -> when the first worker event answering that input was published
    (``column`` 0, the tap's stamp) or emitted (5, the worker's)."""
    out: dict[tuple[str, str], float] = {}
    for row in rows:
        if len(row) == 6 and row[2] in STEP_EVENTS and row[3] and row[column]:
            out.setdefault((row[1], row[3]), row[column])
    return out


def _by_kind(lat: list[tuple[str, float]]) -> dict[str, dict[str, float | int | None]]:
    """Percentiles of each kind of delta (text, audio, listen)."""
    return {k: percentiles([x[1] for x in lat if x[0] == k]) for k in sorted({x[0] for x in lat})}


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
        "latency_ms_by_kind": _by_kind(lat),
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
    published, emitted = _emit_times(rows), _emit_times(rows, column=5)
    lat, from_emit, unmatched = [], [], 0
    for t_recv, sid, kind, input_id, _ in in_window(res):
        t, t_emit = published.get((sid, input_id)), emitted.get((sid, input_id))
        if t is None or t_emit is None:
            unmatched += 1
        else:
            lat.append((kind, (t_recv - t) * 1000))
            from_emit.append((kind, (t_recv - t_emit) * 1000))
    out = _summary(n, res, lat, unmatched)
    out["emit_latency_ms"] = percentiles([x[1] for x in from_emit])
    out["emit_latency_ms_by_kind"] = _by_kind(from_emit)
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
