"""What one real-time duplex session costs Redis: CPU, commands, bytes in and out, memory.

    python -m bench redis-footprint [--sessions 50,150] [--seconds 20] [--warmup 8]
                                    [--redis-url URL] [--set NAME=VALUE ...] [--output NAME]

Starts the bench's own stack (bench/stack.py: a private redis-server unless ``--redis-url``
names one, a gateway, scripted workers), reads Redis ``INFO`` with no sessions (idle), then runs
each level of real-time audio duplex sessions (bench/duplex_load.py: one 1 s chunk of 16 kHz
audio a second, one second of 24 kHz speech a step) and reads ``INFO`` at the start and the end
of a steady window. Per session it prints the share of a Redis core (``used_cpu_sys`` +
``used_cpu_user``), commands/s (``total_commands_processed``), KiB/s in and out
(``total_net_input_bytes`` / ``total_net_output_bytes``) and MiB held (``used_memory`` at the
window's end, less idle), each above the idle figure, with ``INFO commandstats`` per command and
``MEMORY USAGE`` of one session's keys by kind, so what costs what shows.

Every primary is read: the URL's node, or, when that node is in cluster mode, every primary
``CLUSTER NODES`` lists; figures are summed over them and printed per node too.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis

KIB = 1024
MIB = 2**20


@dataclass(frozen=True, slots=True)
class Node:
    """One primary of the data plane."""

    host: str
    port: int

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"


def seed_url(url: str) -> str:
    """A plain ``redis://`` URL for the first node a (possibly cluster: ``redis+cluster://H1:P1,
    H2:P2/``) URL names: where the node list is read."""
    m = re.match(r"^(rediss?)(?:\+cluster)?://(?:([^@/]*)@)?([^/]*)(/.*)?$", url)
    if not m:
        return url
    scheme, auth, hosts, _path = m.groups()
    first = hosts.split(",")[0]
    return f"{scheme}://{auth + '@' if auth else ''}{first}/0"


def primaries(url: str) -> list[tuple[Node, redis.Redis]]:
    """Every primary of the Redis ``url`` names, with a client of each."""
    seed = redis.Redis.from_url(seed_url(url))
    if int(seed.info("cluster").get("cluster_enabled", 0)) != 1:
        kw = seed.connection_pool.connection_kwargs
        return [(Node(str(kw.get("host", "?")), int(kw.get("port", 0))), seed)]
    out: list[tuple[Node, redis.Redis]] = []
    # redis-py parses the reply: address -> {"flags": "myself,master", ...}
    listed = cast("dict[str, dict[str, Any]]", seed.cluster("NODES"))
    kw = dict(seed.connection_pool.connection_kwargs)
    seed_host = kw.get("host")
    for addr, node_info in listed.items():
        flags = str(node_info.get("flags", "")).split(",")
        if "master" not in flags or "fail" in flags:
            continue
        host, _, port = addr.rpartition(":")
        host = host or str(seed_host)  # (a node alone may not know its own host)
        node = Node(host, int(port))
        kw.update(host=host, port=int(port))
        pool = redis.ConnectionPool(connection_class=seed.connection_pool.connection_class, **kw)
        out.append((node, redis.Redis(connection_pool=pool)))
    return sorted(out, key=lambda x: (x[0].host, x[0].port))


@dataclass(slots=True)
class Snapshot:
    """One node's counters at one moment."""

    t: float
    cpu_s: float
    commands: int
    net_in: int
    net_out: int
    used_memory: int
    commandstats: dict[str, tuple[int, float]]  # command -> (calls, usec)


def snapshot(client: redis.Redis) -> Snapshot:
    info = client.info("all")
    stats: dict[str, tuple[int, float]] = {}
    for key, val in info.items():
        if key.startswith("cmdstat_") and isinstance(val, dict):
            stats[key[len("cmdstat_") :]] = (int(val["calls"]), float(val["usec"]))
    return Snapshot(
        t=time.time(),
        cpu_s=float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        commands=int(info["total_commands_processed"]),
        net_in=int(info["total_net_input_bytes"]),
        net_out=int(info["total_net_output_bytes"]),
        used_memory=int(info["used_memory"]),
        commandstats=stats,
    )


def rates(a: Snapshot, b: Snapshot) -> dict[str, Any]:
    """Rates over ``a``..``b``: % of a core, commands/s, KiB/s in and out, memory at ``b``."""
    dt = max(b.t - a.t, 1e-6)
    cmds: dict[str, dict[str, float]] = {}
    for name, (calls, usec) in b.commandstats.items():
        c0, u0 = a.commandstats.get(name, (0, 0.0))
        if calls > c0:
            cmds[name] = {"per_s": (calls - c0) / dt, "usec_per_s": (usec - u0) / dt}
    return {
        "seconds": dt,
        "cpu_pct": (b.cpu_s - a.cpu_s) / dt * 100,
        "commands_per_s": (b.commands - a.commands) / dt,
        "in_kib_s": (b.net_in - a.net_in) / dt / KIB,
        "out_kib_s": (b.net_out - a.net_out) / dt / KIB,
        "used_mib": b.used_memory / MIB,
        "commands": cmds,
    }


def read_all(nodes: list[tuple[Node, redis.Redis]]) -> dict[str, Snapshot]:
    return {node.name: snapshot(client) for node, client in nodes}


def window(a: dict[str, Snapshot], b: dict[str, Snapshot]) -> dict[str, dict[str, Any]]:
    return {name: rates(a[name], b[name]) for name in a}


def total(per_node: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Sum of the nodes' rates (one command table over all nodes)."""
    out: dict[str, Any] = {
        k: sum(v[k] for v in per_node.values())
        for k in ("cpu_pct", "commands_per_s", "in_kib_s", "out_kib_s", "used_mib")
    }
    cmds: dict[str, dict[str, float]] = {}
    for v in per_node.values():
        for name, c in v["commands"].items():
            acc = cmds.setdefault(name, {"per_s": 0.0, "usec_per_s": 0.0})
            acc["per_s"] += c["per_s"]
            acc["usec_per_s"] += c["usec_per_s"]
    out["commands"] = cmds
    return out


def key_kinds(nodes: list[tuple[Node, redis.Redis]], prefix: str) -> dict[str, dict[str, float]]:
    """``MEMORY USAGE`` of the sessions' keys, by kind (the name after the session id), per
    running session (one with a lease)."""
    kinds: dict[str, list[int]] = {}
    sessions: set[str] = set()
    for _node, client in nodes:
        for key in client.scan_iter(f"{prefix}:s:*", count=1000):
            name = key.decode()
            rest = name[len(prefix) + 3 :]
            sid, _, kind = rest.partition(":")
            if kind == "lease":
                sessions.add(sid)
            used = client.memory_usage(key, samples=0) or 0
            kinds.setdefault(kind or "(none)", []).append(int(used))
    n = max(1, len(sessions))
    return {
        kind: {"keys": len(v), "kib_per_session": sum(v) / n / KIB}
        for kind, v in sorted(kinds.items())
    }


def sessions_on(nodes: list[tuple[Node, redis.Redis]], prefix: str) -> dict[str, int]:
    """How many running sessions (one with a lease) have their keys on each node."""
    return {
        node.name: sum(1 for _ in client.scan_iter(f"{prefix}:s:*:lease", count=1000))
        for node, client in nodes
    }


def per_session(load: dict[str, Any], idle: dict[str, Any], n: int) -> dict[str, float]:
    """One session's share: (load - idle) / n."""
    return {
        "core_pct": (load["cpu_pct"] - idle["cpu_pct"]) / n,
        "commands_per_s": (load["commands_per_s"] - idle["commands_per_s"]) / n,
        "in_kib_s": (load["in_kib_s"] - idle["in_kib_s"]) / n,
        "out_kib_s": (load["out_kib_s"] - idle["out_kib_s"]) / n,
        "held_mib": (load["used_mib"] - idle["used_mib"]) / n,
    }


async def run_level(
    stack: Any, nodes: list[tuple[Node, redis.Redis]], n: int, seconds: float, warmup: float
) -> dict[str, Any]:
    from bench import duplex_load

    started = asyncio.Event()
    load = asyncio.create_task(duplex_load.run_load(stack.url, n, seconds, warmup, started))
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait([load, waiter], return_when=asyncio.FIRST_COMPLETED)
    if load.done():
        waiter.cancel()
        res = load.result()
        raise RuntimeError(f"{n} sessions did not start: {res.errors[:3]}")
    await asyncio.sleep(warmup)
    a = await asyncio.to_thread(read_all, nodes)
    await asyncio.sleep(seconds)
    b = await asyncio.to_thread(read_all, nodes)
    kinds = await asyncio.to_thread(key_kinds, nodes, stack.prefix)
    spread = await asyncio.to_thread(sessions_on, nodes, stack.prefix)
    res = await load
    got = len(duplex_load.in_window(res))
    return {
        "sessions": n,
        "started": res.sessions,
        "errors": res.errors[:5],
        "dropped_chunks": res.dropped_chunks,
        "deltas_per_session_s": got / max(1, res.sessions) / seconds,
        "per_node": window(a, b),
        "keys": kinds,
        "sessions_on": spread,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Each level on a deployment of its own (own key prefix): its gateway alone first (idle),
    then exactly as many worker slots as sessions, so no idle slot's upkeep is counted either
    way; its keys are deleted before the next level."""
    from bench.stack import Stack, shared_redis

    levels = [int(x) for x in args.sessions.split(",") if x.strip()]
    url = args.redis_url or shared_redis()
    nodes = primaries(url)
    out: dict[str, Any] = {
        "command": "python -m bench redis-footprint " + " ".join(args.argv),
        "nodes": [node.name for node, _ in nodes],
        "method": "per session = (INFO over the window with N sessions - INFO over an idle "
        "window of the same gateway, no worker) / N; memory: used_memory at the window's end "
        "less the idle one",
        "levels": [],
    }
    env = dict(x.split("=", 1) for x in args.set)
    out["settings"] = env
    for n in levels:
        out["levels"].append(measure_level(Stack(url, env=env), nodes, n, args))
    return out


def measure_level(
    stack: Any, nodes: list[tuple[Node, redis.Redis]], n: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One level on ``stack`` (a ``bench.stack.Stack`` not started): its gateway alone over
    ``args.idle`` seconds, then ``n`` sessions on ``n`` worker slots; the stack is stopped and
    its keys deleted after."""
    try:
        stack.start_gateway()
        time.sleep(1)
        a = read_all(nodes)
        time.sleep(args.idle)
        idle_nodes = window(a, read_all(nodes))
        idle = total(idle_nodes)
        progress(f"idle (gateway, no worker): {line(idle)}")
        stack.start_workers(n)
        lv = asyncio.run(run_level(stack, nodes, n, args.seconds, args.warmup))
        lv["idle"] = idle_nodes
        lv["total"] = total(lv["per_node"])
        lv["per_session"] = per_session(lv["total"], idle, n)
        progress(f"{n} sessions: {line(lv['total'])}")
        return lv
    finally:
        stack.stop()


def line(t: dict[str, Any]) -> str:
    return (
        f"{t['cpu_pct']:.2f} % core, {t['commands_per_s']:.0f} commands/s, "
        f"{t['in_kib_s']:.0f} KiB/s in, {t['out_kib_s']:.0f} KiB/s out, {t['used_mib']:.1f} MiB"
    )


def render(out: dict[str, Any]) -> str:
    lines = [f"Redis nodes read: {', '.join(out['nodes'])}", ""]
    lines.append(
        f"{'sessions':>8} {'% core':>8} {'cmd/s':>7} {'KiB/s in':>9} {'KiB/s out':>9} "
        f"{'MiB held':>9}   (per session, above idle)"
    )
    for lv in out["levels"]:
        p = lv["per_session"]
        lines.append(
            f"{lv['sessions']:>8} {p['core_pct']:>8.4f} {p['commands_per_s']:>7.1f} "
            f"{p['in_kib_s']:>9.1f} {p['out_kib_s']:>9.1f} {p['held_mib']:>9.3f}"
        )
    lines.append("")
    lines.append("totals (all nodes):")
    for lv in out["levels"]:
        lines.append("  idle          " + line(total(lv["idle"])))
        lines.append(f"  {lv['sessions']:>4} sessions " + line(lv["total"]))
        if len(lv["per_node"]) > 1:
            for name, v in lv["per_node"].items():
                lines.append(f"          {name}: " + line(v))
        extra = f"          deltas/session/s {lv['deltas_per_session_s']:.2f}"
        extra += f", dropped chunks {lv['dropped_chunks']}"
        if lv["errors"]:
            extra += f", errors {lv['errors']}"
        lines.append(extra)
    for lv in out["levels"]:
        n = lv["sessions"]
        idle = total(lv["idle"])["commands"]
        lines.append("")
        lines.append(f"per command at {n} sessions (per session, above idle):")
        lines.append(f"  {'command':<14} {'calls/s':>8} {'µs/s':>8} {'% core':>8}")
        rows = []
        for name, c in lv["total"]["commands"].items():
            i = idle.get(name, {"per_s": 0.0, "usec_per_s": 0.0})
            calls = (c["per_s"] - i["per_s"]) / n
            rows.append((name, calls, (c["usec_per_s"] - i["usec_per_s"]) / n))
        for name, calls, usec in sorted(rows, key=lambda r: -r[2]):
            if calls < 0.005 and usec < 0.05:
                continue
            lines.append(f"  {name:<14} {calls:>8.2f} {usec:>8.1f} {usec / 1e4:>8.4f}")
        lines.append(f"  keys held per session ({lv['sessions']} running, MEMORY USAGE):")
        for kind, k in lv["keys"].items():
            lines.append(f"    {kind:<14} {k['kib_per_session']:>9.1f} KiB ({k['keys']} keys)")
    return "\n".join(lines)


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def add_level_args(p: argparse.ArgumentParser) -> None:
    """The options of a level: its windows, the stack's settings, the results file."""
    p.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    p.add_argument("--warmup", type=float, default=8.0, help="streaming before the window")
    p.add_argument("--idle", type=float, default=5.0, help="the idle window (no sessions)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the gateway and workers, e.g. OMNISERVE_OUTPUT_WRITE=pipeline "
        "(repeatable)",
    )
    p.add_argument("--output", help="results file name (bench/results/NAME.json)")


def run_measure(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: list[str],
    measure: Callable[[argparse.Namespace], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    name: str,
) -> int:
    """Check ``--set``, run ``measure`` with every process it starts killed after, write the
    results (``bench/results/<--output or name>.json``) and print ``render`` of them."""
    bad = [x for x in args.set if "=" not in x]
    if bad:
        p.error(f"--set wants NAME=VALUE, not {bad[0]!r}")
    args.argv = argv
    from bench import report
    from bench.stack import install_cleanup, kill_all

    install_cleanup()
    try:
        out = measure(args)
    finally:
        kill_all()
    out["machine"] = report.machine()
    path = report.write_json(args.output or name, out)
    print(render(out))
    print(f"results: {path}")
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench redis-footprint", description=__doc__)
    p.add_argument("--sessions", default="50,150", help="comma list of session counts")
    p.add_argument(
        "--redis-url",
        help="an existing Redis (a cluster: any node, or redis+cluster://H1:P1,H2:P2/); "
        "default: a private redis-server",
    )
    add_level_args(p)
    return run_measure(p, p.parse_args(argv), argv, measure, render, "redis-footprint")
