"""The floor under Redis's CPU per duplex session: what one round trip, and one session's audio
through Redis, cost its CPU on this machine, with the caller on Redis's own vCPU and on another.

    python -m bench redis-floor [--rounds 3000] [--redis-url URL] [--json]

A real-time duplex session needs, each second, at least four exchanges with Redis, whatever the
code around them: its input chunk written (the gateway) and read (the worker), its output
written (the worker) and delivered (to the gateway's subscription). Each wakes Redis from its
wait for the next event and moves the audio (64,000 bytes in, 96,000 out: 16 kHz and 24 kHz
float32). Measured here one at a time, from one client, against a private ``redis-server``
(or ``--redis-url``) pinned to one vCPU, each as Redis's CPU per operation
(``used_cpu_sys + used_cpu_user`` over ``--rounds`` operations):

- **round trip**: a ``PING``.
- **input**: a chunk ``XADD`` to a stream, then read back with ``XREAD`` (two round trips).
- **output**: an event published and logged by the output script (``lua.OUTPUT_WRITE``) with one
  subscriber reading it; and by a pipelined ``PUBLISH`` and ``XADD`` (``output_write`` =
  ``pipeline``).

Each with the audio's size and with 1,000 bytes, which tells the share of the bytes from that
of the wake-ups. The floor per session and second is one input and one output; the per-session
figure of ``redis-footprint`` sits above it by what the rest costs (leases, presence, replies).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import redis

from streaming.lua import OUTPUT_WRITE

INPUT_BYTES = 64_000  # 1 s of 16 kHz float32 audio
OUTPUT_BYTES = 96_000  # 1 s of 24 kHz float32 audio
SMALL_BYTES = 1_000
TARGET_US = 350.0  # 0.035 % of a core per session


def _cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def per_op_us(r: redis.Redis, rounds: int, op: Callable[[int], None]) -> float:
    """Redis's CPU per call of ``op``, in µs (a few calls first, not counted)."""
    for n in range(20):
        op(n)
    before = _cpu(r)
    for n in range(rounds):
        op(n)
    return (_cpu(r) - before) / rounds * 1e6


def ping_op(r: redis.Redis) -> Callable[[int], None]:
    """A round trip with nothing in it."""

    def op(_n: int) -> None:
        r.ping()

    return op


def input_op(r: redis.Redis, size: int) -> Callable[[int], None]:
    """A chunk written, then read, then the stream trimmed in the read's round trip."""
    payload = os.urandom(size)
    key = "floor:in"
    last = ["0-0"]

    def op(n: int) -> None:
        r.xadd(key, {"audio": payload, "seq": n})
        with r.pipeline(transaction=False) as pipe:
            pipe.xtrim(key, minid=last[0], approximate=False)
            pipe.xread({key: last[0]}, block=1000)
            _, got = pipe.execute()
        last[0] = got[0][1][-1][0].decode()

    return op


def output_op(r: redis.Redis, sub: Any, size: int, script: bool = True) -> Callable[[int], None]:
    """An event published and logged by the output script (or, ``script`` False, by a
    ``PUBLISH`` and an ``XADD`` in one pipeline: ``output_write`` = ``pipeline``), its copy
    read by a subscriber."""
    write = r.register_script(OUTPUT_WRITE)
    payload = os.urandom(size)
    seqs = itertools.count()
    r.delete("floor:log")

    def op(_n: int) -> None:
        n = next(seqs)
        minid = f"{n - 3}-1" if n > 3 else ""
        if script:
            write(keys=["floor:log", "floor:out"], args=[0, minid, n + 1, payload])
        else:
            with r.pipeline(transaction=False) as pipe:
                pipe.publish("floor:out", payload)
                pipe.xadd("floor:log", {"e": payload}, id=f"{n + 1}-1", minid=minid or None)
                pipe.execute()
        while sub.get_message(timeout=1.0) is None:
            pass

    return op


def measure(r: redis.Redis, rounds: int) -> dict[str, dict[str, float]]:
    """Every operation at both sizes, for the caller on each placement this machine has."""
    pid = int(r.info("server")["process_id"])
    cpus = sorted(os.sched_getaffinity(0))
    redis_cpu = cpus[-1]
    placements: dict[str, int | None] = {"same vCPU": redis_cpu}
    if len(cpus) > 1:
        placements["other vCPU"] = cpus[0]
    own = os.sched_getaffinity(0)
    sub = r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    sub.subscribe("floor:out")
    while sub.get_message(timeout=1.0) is None and not sub.subscribed:
        pass
    try:
        os.sched_setaffinity(pid, {redis_cpu})
    except OSError:  # a Redis of another host or user: the caller runs where it is scheduled
        placements = {"as scheduled": None}
    out: dict[str, dict[str, float]] = {}
    try:
        for name, cpu in placements.items():
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            row = out.setdefault(name, {})
            row["round trip"] = per_op_us(r, rounds, ping_op(r))
            for size, label in ((INPUT_BYTES, "input"), (SMALL_BYTES, "input, 1 KB")):
                row[label] = per_op_us(r, rounds, input_op(r, size))
            for size, label in ((OUTPUT_BYTES, "output"), (SMALL_BYTES, "output, 1 KB")):
                row[label] = per_op_us(r, rounds, output_op(r, sub, size))
            row["output, pipeline"] = per_op_us(
                r, rounds, output_op(r, sub, OUTPUT_BYTES, script=False)
            )
            row["floor per session-second"] = row["input"] + row["output"]
    finally:
        os.sched_setaffinity(0, own)
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, set(cpus))
        sub.close()
        r.delete("floor:in", "floor:log")
    return out


def render(out: dict[str, Any]) -> str:
    rows = out["placements"]
    names = list(rows)
    lines = [
        f"Redis {out['redis_version']}, {out['rounds']} operations each; µs of Redis CPU per "
        "operation (caller on Redis's vCPU / on another)",
        "",
        f"  {'':34s}" + "".join(f"{n:>14s}" for n in names),
    ]
    labels = {
        "round trip": "round trip (PING)",
        "input": f"input: {INPUT_BYTES:,} B written, read",
        "input, 1 KB": f"input: {SMALL_BYTES:,} B written, read",
        "output": f"output: {OUTPUT_BYTES:,} B script, delivered",
        "output, 1 KB": f"output: {SMALL_BYTES:,} B script, delivered",
        "output, pipeline": f"output: {OUTPUT_BYTES:,} B pipeline, delivered",
        "floor per session-second": "floor: one input + one output",
    }
    for key, label in labels.items():
        lines.append(f"  {label:34s}" + "".join(f"{rows[n][key]:14.1f}" for n in names))
    lines.append(f"\n  target per session-second: {TARGET_US:.0f} µs (0.035 % of a core)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench redis-floor", description=__doc__)
    p.add_argument("--rounds", type=int, default=3000, help="operations per figure")
    p.add_argument("--redis-url", help="an existing Redis (default: a private redis-server)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = p.parse_args(argv)
    server = None
    url = args.redis_url
    if url is None:
        from omniserve.redis_server import start_embedded

        server = start_embedded()
        url = server.url
    r = redis.Redis.from_url(url)
    try:
        started = time.monotonic()
        out = {
            "redis_version": r.info("server")["redis_version"],
            "rounds": args.rounds,
            "placements": measure(r, args.rounds),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        r.close()
        if server is not None:
            server.stop()
    print(render(out))
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
