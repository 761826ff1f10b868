"""A partition that drops packets between one component (the gateway or a worker) and Redis, run
inside a network namespace of its own (``unshare -rn``: root there, nothing outside touched),
where routes can drop packets.

The component cut off reaches Redis through ``ADDR`` (a TEST-NET-1 address on the namespace's
loopback, served by ``tests/support/tcp_proxy.py`` forwarding to the Redis on 127.0.0.1); the
rest reach Redis directly. ``cut`` routes the address to a TUN device nobody reads: every packet
to or from it is dropped without a word (no reset, no ICMP error), as when Redis's host goes dark
or a switch fails, unlike the frozen proxy of ``tests/faults/test_partition.py`` whose kernel still
acknowledges what it is sent. ``heal`` gives the address its local route back.

``unshare -rn python -m tests.support.dropped_packets_scenario gateway|worker CUT_S`` prints one
JSON object: what each client saw, and whether the service came back
(``tests/faults/test_dropped_packets.py`` asserts on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import orjson
import redis

from omniserve.redis_server import free_port
from tests.support.fault_harness import (
    DuplexProbe,
    RestartableRedis,
    all_slots_back,
    await_for,
    log_text,
    open_with_one_link_apart,
    served_end_to_end,
)
from tests.support.stack import Stack
from tests.support.tcp_proxy import Link

ADDR = "192.0.2.7"
AFTER_S = 10.0  # watched after the heal


def _ip(*commands: str) -> None:
    for command in commands:
        subprocess.run(["ip", *command.split()], check=True)


def set_up() -> None:
    """The namespace's loopback up with ``ADDR``, and the TUN device a cut routes it to."""
    _ip("link set lo up", f"addr add {ADDR}/32 dev lo", "tuntap add dev cut0 mode tun")
    _ip("link set cut0 up")


def cut() -> None:
    """Every packet to or from ``ADDR`` dropped from now on."""
    _ip(f"route del local {ADDR} dev lo table local", f"route add {ADDR}/32 dev cut0")


def heal() -> None:
    _ip(f"route del {ADDR}/32 dev cut0", f"route add local {ADDR} dev lo table local")


async def cut_for(seconds: float) -> None:
    """Packets to and from ``ADDR`` dropped for ``seconds``, then the network heals."""
    cut()
    try:
        await asyncio.sleep(seconds)
    finally:
        heal()


@contextlib.contextmanager
def stack_with_a_link() -> Iterator[tuple[RestartableRedis, Stack, str]]:
    """This namespace set up, a Redis, the proxy on ``ADDR`` in front of it and an empty stack;
    yields them with the Redis URL through the link. Everything is stopped after."""
    set_up()
    redis_server = RestartableRedis()
    redis_server.start()
    link = Link(free_port(), redis_server.port, host=ADDR)
    stack = Stack(redis_server.url)
    try:
        yield redis_server, stack, f"redis://{ADDR}:{link.port}/0"
    finally:
        stack.stop()
        link.close()
        redis_server.stop()


def _seen(probe: DuplexProbe, since: float) -> dict[str, Any]:
    """What the client saw from ``since`` (monotonic) on."""
    frames = [(t, f) for t, f in probe.frames if t > since]
    first_delta = next((t for t, f in frames if f["type"] == "response.output.delta"), None)
    return {
        "kinds": [f["type"] for _, f in frames if "delta" not in f["type"]],
        "errors": [f["error"]["code"] for _, f in frames if f["type"] == "error"],
        "closed": probe.closed_at is not None,
        "first_delta_s": None if first_delta is None else round(first_delta - since, 2),
        "deltas_in_last_5_s": probe.deltas_after(time.monotonic() - 5.0),
    }


def subscribers(server: RestartableRedis) -> list[int]:
    """Redis's ids of the connections subscribed to channels: the gateway's output bus (a new
    connection gets a new id; the workers' Celery connections subscribe to patterns only)."""
    client = redis.Redis(port=server.port)
    try:
        return sorted(int(c["id"]) for c in client.client_list() if int(c.get("sub", 0)) > 0)
    finally:
        client.close()


async def gateway_cut(cut_s: float) -> dict[str, Any]:
    """The gateway's packets to Redis dropped while two duplex sessions run."""
    out: dict[str, Any] = {}
    with stack_with_a_link() as (redis_server, stack, url):
        probes, _ = await open_with_one_link_apart(stack, "gateway", url)
        try:
            await await_for(lambda: all(p.deltas_after(0) > 0 for p in probes), 30, "deltas")
            out["subscribers_before"] = subscribers(redis_server)
            began = time.monotonic()
            await cut_for(cut_s)
            healed = time.monotonic()
            await asyncio.sleep(AFTER_S)
            out["subscribers_after"] = subscribers(redis_server)
            out["probes"] = [_seen(p, healed) for p in probes]
            out["from_cut"] = [_seen(p, began) for p in probes]
        finally:
            for p in probes:
                await p.close()
        try:
            all_slots_back(stack, 4, timeout=30)
            out["slots_back"] = True
        except AssertionError as exc:
            out["slots_back"] = str(exc)
        t0 = time.monotonic()
        frames = await served_end_to_end(stack.url(), timeout=60)
        out["new_session_served_s"] = round(time.monotonic() - t0, 2)
        out["new_session_answered"] = any(f["type"] == "response.output.delta" for f in frames)
        out["gateway_alive"] = all(p.alive() for p, _ in stack.gateways)
        out["log"] = log_text(stack.gateways[0][0])[-6000:]
    return out


async def worker_cut(cut_s: float) -> dict[str, Any]:
    """The packets of the only worker to Redis dropped while it is idle; then, as soon as it
    offers its slots again, new sessions: what each client got (``served``, or the error it
    ended with)."""
    out: dict[str, Any] = {"sessions": []}
    with stack_with_a_link() as (_, stack, url):
        stack.start_worker(slots=2, OMNISERVE_REDIS_URL=url)
        stack.start_gateway()
        await served_end_to_end(stack.url())  # every connection of the worker in use once
        await cut_for(cut_s)
        # its heartbeat offers its slots again (until then a client is told no worker is up)
        out["slots_back_s"] = await await_for(lambda: stack.live_slots() == 2, 30, "its slots")
        for _ in range(2):
            t0 = time.monotonic()
            try:
                await served_end_to_end(stack.url(), timeout=60)
                got = "served"
            except Exception as exc:
                got = repr(exc)[:300]
            out["sessions"].append({"got": got, "s": round(time.monotonic() - t0, 2)})
        out["worker_alive"] = stack.workers[0].alive()
        out["log"] = log_text(stack.workers[0])[-6000:]
    return out


if __name__ == "__main__":
    cases = {"gateway": gateway_cut, "worker": worker_cut}
    result = asyncio.run(cases[sys.argv[1]](float(sys.argv[2])))
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
