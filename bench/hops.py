"""What one hop from process to process costs on this host: the floor under the stack's gaps.

    python -m bench.hops [--messages 300] [--gap-ms 10] [--bytes 64]

The stack's paths cross more processes than the baseline's: a duplex delta goes worker -> Redis
-> gateway -> client where the baseline's goes server -> client, and a chat turn's first delta
adds the admission round trip, the task's push, the worker's pickup and claim. Each hop is a
wake-up of a sleeping process; on a virtual machine that can cost far more than the work the
message carries. This measures it alone, with small messages and nothing else running: a
sender stamps each message, the receiver reads it and takes the difference (one wall clock),
one message every ``--gap-ms`` (the processes sleep between, as a session's do between steps).

Paths, pinned as the benchmarks pin (the gateway's core, and the rest's):

- ``socket, one core``: a Unix socket between two processes on one of the rest's cores;
- ``socket, two cores``: from the rest's core to the gateway's;
- ``redis pub/sub``: ``PUBLISH`` from the rest's core through the benchmarks' Redis (there
  too) to a subscriber on the gateway's core, with the clients the stack uses there (a worker's
  synchronous redis-py; the gateway's asyncio redis-py over RESP3, on uvloop): a worker's event
  reaching the gateway, two hops;
- ``pub/sub, raw RESP``: the same through bare sockets speaking RESP, no client library: the
  difference is redis-py's own path, which after a sleep runs on a cold core;
- ``redis round trip``: a command (``PING``) and its reply from the gateway's core (the
  admission's scripts, a task's push, a worker's claim), two hops.

Printed per path: p50, p90 and p99 of the delay in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from bench import pinning
from bench.report import percentiles
from bench.stack import install_cleanup, kill_all, shared_redis

RECEIVE = """
import json, socket, sys, time
kind, where, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
delays = []
if kind == "socket":
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(where)
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    f = conn.makefile("rb")
    for _ in range(n):
        line = f.readline()
        delays.append(time.time() - float(line.split(b"|", 1)[0]))
elif kind == "roundtrip":
    import redis
    client = redis.Redis.from_url(where)
    gap = float(sys.argv[4])
    print("ready", flush=True)
    for _ in range(n):
        time.sleep(gap)
        t = time.time()
        client.ping()
        delays.append(time.time() - t)
elif kind == "resp":
    from urllib.parse import urlsplit
    url = urlsplit(where)
    conn = socket.create_connection((url.hostname, url.port))
    f = conn.makefile("rb")
    conn.sendall(b"SUBSCRIBE bench:hops\\r\\n")
    for _ in range(6):  # the confirmation: *3, $9 subscribe, $10 bench:hops, :1
        f.readline()
    print("ready", flush=True)
    for _ in range(n):
        for _ in range(6):  # *3, $7, message, $10, bench:hops, then the data's length
            line = f.readline()
        data = f.read(int(line[1:]) + 2)
        delays.append(time.time() - float(data.split(b"|", 1)[0]))
else:  # as the gateway reads: redis-py's asyncio pub/sub over RESP3, on uvloop
    import redis.asyncio as aioredis
    import uvloop

    async def _keep(message):
        return message

    async def receive():
        client = aioredis.Redis.from_url(where, protocol=3)
        ps = client.pubsub(ignore_subscribe_messages=True, push_handler_func=_keep)
        await ps.subscribe("bench:hops")
        print("ready", flush=True)
        while len(delays) < n:
            msg = await ps.get_message(timeout=None)
            if msg is not None and msg.get("type") == "message":
                delays.append(time.time() - float(msg["data"].split(b"|", 1)[0]))

    uvloop.run(receive())
print(json.dumps([d * 1000 for d in delays]), flush=True)
"""


def _send(kind: str, where: str, n: int, gap_s: float, size: int) -> None:
    """Stamp and send ``n`` messages, one every ``gap_s``, from this process."""
    pad = b"x" * max(0, size - 20)
    if kind == "socket":
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(where)
        for _ in range(n):
            time.sleep(gap_s)
            conn.sendall(b"%.6f|%s\n" % (time.time(), pad))
        conn.close()
        return
    if kind == "resp":
        url = urlsplit(where)
        conn = socket.create_connection((url.hostname, url.port))
        replies = conn.makefile("rb")
        for _ in range(n):
            time.sleep(gap_s)
            data = b"%.6f|%s" % (time.time(), pad)
            conn.sendall(
                b"*3\r\n$7\r\nPUBLISH\r\n$10\r\nbench:hops\r\n$%d\r\n%s\r\n" % (len(data), data)
            )
            replies.readline()
        conn.close()
        return
    import redis

    from streaming.redis_connection import gathered

    client = redis.Redis(connection_pool=gathered(redis.ConnectionPool.from_url(where)))
    for _ in range(n):  # as a worker writes: redis-py's synchronous client
        time.sleep(gap_s)
        client.publish("bench:hops", b"%.6f|%s" % (time.time(), pad))


def one_path(
    kind: str, where: str, n: int, gap_s: float, size: int, receiver_cores: set[int] | None
) -> list[float]:
    """The delays (ms) of ``n`` messages along one path; the receiver on ``receiver_cores``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", RECEIVE, kind, where, str(n), str(gap_s)],
        stdout=subprocess.PIPE,
        preexec_fn=(lambda: os.sched_setaffinity(0, receiver_cores)) if receiver_cores else None,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        raise RuntimeError("the receiver did not start")
    if kind != "roundtrip":
        _send(kind, where, n, gap_s, size)
    out, _ = proc.communicate(timeout=60)
    delays: list[float] = json.loads(out)
    return sorted(delays[10:])  # the connection's first messages left out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=300)
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--bytes", type=int, default=64, help="message size")
    args = p.parse_args(argv)
    install_cleanup()
    plan = pinning.plan(True)
    pinning.activate(plan)  # this process (the sender) and Redis on the rest's cores
    server = set(plan.server) if plan else None
    rest = set(plan.rest) if plan else None
    url = shared_redis()
    print(plan.describe() if plan else "not pinned (fewer than two cores)")
    print("path                p50 ms  p90 ms  p99 ms")
    one = {min(rest)} if rest else None  # the one-core path: sender and receiver there
    tmp = tempfile.TemporaryDirectory(prefix="omniserve-bench-hops-")
    sock = str(Path(tmp.name) / "hop.sock")
    paths = [  # label, kind, where, the sender's cores, the receiver's
        ("socket, one core", "socket", sock, one, one),
        ("socket, two cores", "socket", sock, rest, server),
        ("redis pub/sub", "redis", url, rest, server),
        ("pub/sub, raw RESP", "resp", url, rest, server),
        ("redis round trip", "roundtrip", url, rest, server),
    ]
    try:
        for label, kind, where, sender, receiver in paths:
            Path(sock).unlink(missing_ok=True)
            if sender:
                os.sched_setaffinity(0, sender)
            delays = one_path(kind, where, args.messages, args.gap_ms / 1000, args.bytes, receiver)
            got = percentiles(delays, (50, 90, 99), digits=3)
            print(f"{label:18}  {got['p50']:6.3f}  {got['p90']:6.3f}  {got['p99']:6.3f}")
    finally:
        kill_all()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
