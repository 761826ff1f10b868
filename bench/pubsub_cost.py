"""CPU time the gateway's pub/sub reader spends per 1 s audio event, by push handler.

    python -m bench.pubsub_cost [--messages 100] [--rounds 3]

redis-py's default RESP3 push handler logs ``"Push response: " + str(response)`` at debug level,
building the repr of every message even with debug logging off; ``streaming/output.py`` passes
its own handler. A separate process publishes ``--messages`` speak-sized events (~128 KB of
base64) while this one is subscribed, so they are all buffered; then this process reads them and
its CPU time (``time.process_time``, not wall time: robust on a shared machine) is divided by
the count. Starts a private ``redis-server``.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

import redis.asyncio as aioredis

from bench.stack import install_cleanup, shared_redis

CHANNEL = "bench:pubsub-cost"
PUBLISHER = """
import base64, os, sys, redis
r = redis.Redis.from_url(sys.argv[1])
data = b'{"type":"speak","audio":"' + base64.b64encode(os.urandom(96000)) + b'"}'
for _ in range(int(sys.argv[2])):
    r.publish(sys.argv[3], data)
"""


async def _pass(message: object) -> object:
    return message


async def cpu_per_message(url: str, n: int, own_handler: bool) -> float:
    """Microseconds of this process's CPU per message read."""
    client = aioredis.Redis.from_url(url)
    ps = client.pubsub(
        ignore_subscribe_messages=True, push_handler_func=_pass if own_handler else None
    )
    await ps.subscribe(CHANNEL)
    await ps.get_message(timeout=0.5)  # the subscribe confirmation
    subprocess.run([sys.executable, "-c", PUBLISHER, url, str(n), CHANNEL], check=True)
    t0, got = time.process_time(), 0
    while got < n:
        msg = await ps.get_message(timeout=5.0)
        if msg is None:
            raise RuntimeError(f"only {got} of {n} messages arrived")
        got += msg["type"] == "message"
    spent = time.process_time() - t0
    await ps.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()
    return spent / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=100)  # 100 x 128 KB stays under Redis's
    p.add_argument("--rounds", type=int, default=3)  # pub/sub output buffer limits
    args = p.parse_args(argv)
    install_cleanup()
    url = shared_redis()
    for i in range(args.rounds):
        default = asyncio.run(cpu_per_message(url, args.messages, own_handler=False))
        own = asyncio.run(cpu_per_message(url, args.messages, own_handler=True))
        print(f"round {i + 1}: redis-py default handler {default:.0f} us/message, own {own:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
