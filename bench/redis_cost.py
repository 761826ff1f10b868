"""Redis's own CPU per admission and per heartbeat, and the ceilings they imply for one core.

    python -m bench redis-cost [--seconds 10] [--slots 4] [--clients 8] [--sessions 200] [--json]

Redis runs commands on one thread, so what one admission or one beat costs that thread is what
caps a deployment once sessions are spread over shards: the admission queue and the registry
live on one slot. Each figure is read from the server itself over a window: its main thread's
CPU time (``INFO cpu``, ``used_cpu_{user,sys}_main_thread``: parsing, commands, replies, the
sockets) and the commands run (``INFO commandstats``; a script's own calls count too).

- **admission**: a real gateway and one scripted worker with ``--slots`` slots; ``--clients``
  WebSocket clients each connect, wait (queued while every slot is taken) for
  ``session.queue_done``, close the session and leave, and again: a ticket queued, given a slot,
  the slot released. The stack's idle rate, measured on the same stack just before, is taken
  off (its heartbeats, lease loop and queue updates).
- **heartbeat**: what a worker's beat sends (``WorkerRuntime.beat_once``: the drain flag, then
  ``WorkerRegistry.heartbeat``: the alive key, the registry entry, each running session's
  lease and slot hold, the idle slots offered) back to back from this process for the window:
  a bare beat, a worker with ``--slots`` idle slots, and one running ``--sessions`` sessions,
  whose difference from the bare beat is ``--sessions`` lease renewals. The gateway's side of
  a session's liveness is its share of the once-a-tick ``lua.LIVENESS`` call over
  ``--sessions`` leases (``api/gateway/liveness.py``).
- **idle stack**: the real gateway and worker with no client, per second: what a deployment
  costs Redis before any session.

Starts a private ``redis-server``; every process it starts is stopped when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import redis
import websockets

from api.protocol.events import ClientEvent, ServerEvent
from bench.stack import Stack, install_cleanup, kill_all, shared_redis
from streaming.keys import Keys
from streaming.redis_connection import worker_client
from streaming.slots import WorkerRegistry

LEASE_TTL_S = 1.5  # the setting's default (``lease_ttl_s``)


@dataclass(frozen=True)
class Sample:
    """What Redis has spent so far: main-thread CPU, time in commands, commands run."""

    at: float
    cpu_s: float
    usec: int
    calls: int
    by_command: dict[str, tuple[int, int]]  # command -> (calls, usec)


@dataclass(frozen=True)
class Window:
    """Redis's spending between two samples, with the operations done meanwhile."""

    seconds: float
    cpu_s: float
    usec: int
    calls: int
    ops: int
    by_command: dict[str, tuple[int, int]]

    def top(self, idle: Window | None = None, n: int = 8) -> dict[str, float]:
        """Calls per operation of the commands that took the most time, the idle rate off."""
        scale = self.seconds / idle.seconds if idle else 0.0
        ops = max(self.ops, 1)
        spent = {}
        for name, (calls, usec) in self.by_command.items():
            base_calls, base_usec = idle.by_command.get(name, (0, 0)) if idle else (0, 0)
            spent[name] = (calls - base_calls * scale, usec - base_usec * scale)
        ranked = sorted(spent.items(), key=lambda kv: -kv[1][1])[:n]
        return {name: round(calls / ops, 2) for name, (calls, _) in ranked if calls > 0}

    def per_op_us(self, idle_cpu_per_s: float = 0.0) -> float | None:
        """µs of Redis main-thread CPU per operation, the idle rate taken off."""
        if not self.ops:
            return None
        return max(0.0, self.cpu_s - idle_cpu_per_s * self.seconds) * 1e6 / self.ops

    def summary(self, idle: Window | None = None) -> dict[str, Any]:
        idle_cpu = idle.cpu_s / idle.seconds if idle else 0.0
        idle_calls = idle.calls / idle.seconds if idle else 0.0
        per = self.per_op_us(idle_cpu)
        ops = max(self.ops, 1)
        return {
            "ops": self.ops,
            "seconds": round(self.seconds, 2),
            "ops_per_s": round(self.ops / self.seconds, 1),
            "redis_cpu_pct": round(self.cpu_s * 100 / self.seconds, 1),
            "redis_cpu_us_per_op": None if per is None else round(per, 1),
            "commands_per_op": round((self.calls - idle_calls * self.seconds) / ops, 2),
            "ceiling_per_core_s": None if not per else int(1e6 / per),
        }


def sample(r: redis.Redis) -> Sample:
    cpu = r.info("cpu")
    main = ("used_cpu_user_main_thread", "used_cpu_sys_main_thread")
    keys = main if all(k in cpu for k in main) else ("used_cpu_user", "used_cpu_sys")
    stats = r.info("commandstats")
    return Sample(
        time.monotonic(),
        sum(float(cpu[k]) for k in keys),
        sum(int(v["usec"]) for v in stats.values()),
        sum(int(v["calls"]) for v in stats.values()),
        {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in stats.items()},
    )


def window(before: Sample, after: Sample, ops: int) -> Window:
    """The spending from ``before`` to ``after`` (the samples' own commands taken off)."""
    zero = (0, 0)
    by_command = {
        name: (
            calls - before.by_command.get(name, zero)[0],
            usec - before.by_command.get(name, zero)[1],
        )
        for name, (calls, usec) in after.by_command.items()
    }
    return Window(
        after.at - before.at,
        after.cpu_s - before.cpu_s,
        after.usec - before.usec,
        after.calls - before.calls - 2,  # the INFO commands of ``after``
        ops,
        by_command,
    )


def measure(r: redis.Redis, seconds: float, step: Callable[[], None] | None) -> Window:
    """Call ``step`` back to back for ``seconds`` (None: only wait), Redis read around it."""
    before = sample(r)
    ops = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if step is None:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            continue
        step()
        ops += 1
    return window(before, sample(r), ops)


# --------------------------------------------------------------------------- admission


async def _admissions(url: str, clients: int, seconds: float) -> int:
    """``clients`` loops of connect, ``session.queue_done``, close, for ``seconds``; how many
    admissions completed."""
    done = 0
    deadline = time.monotonic() + seconds

    async def cycle() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            async with websockets.connect(
                f"{url}/v1/realtime?mode=audio", ping_interval=None, open_timeout=30
            ) as ws:
                while True:
                    ev = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
                    if ev["type"] == ServerEvent.SESSION_QUEUE_DONE:
                        break
                    if ev["type"] == ServerEvent.ERROR:
                        raise RuntimeError(f"admission refused: {ev['error']}")
                close = {"type": ClientEvent.SESSION_CLOSE, "reason": "user_stop"}
                await ws.send(orjson.dumps(close).decode())
            done += 1

    await asyncio.gather(*(cycle() for _ in range(clients)))
    return done


def admission(stack: Stack, clients: int, seconds: float) -> tuple[Window, Window]:
    """The stack idle for ``seconds``, then under admissions for ``seconds``."""
    r = stack.redis()
    idle = measure(r, seconds, None)
    before = sample(r)
    count = asyncio.run(_admissions(stack.url, clients, seconds))
    stack.wait_free(stack.slots, timeout=30)  # the last releases are in the window
    return idle, window(before, sample(r), count)


# --------------------------------------------------------------------------- heartbeats


@dataclass
class Beat:
    """What one worker process's heartbeat sends Redis (``WorkerRuntime.beat_once``: its drain
    flag read, then ``WorkerRegistry.heartbeat``), on the worker's own heartbeat client."""

    registry: WorkerRegistry
    node: str
    idle: list[str]
    active: dict[str, str]

    @classmethod
    def of(cls, url: str, slots: int, offered: bool = True, running: bool = False) -> Beat:
        """A registered ready worker of ``slots`` slots: each offered when idle (``offered``),
        or each running a session (``running``)."""
        keys = Keys("brc" + uuid.uuid4().hex[:6])
        node = f"bench-{uuid.uuid4().hex[:6]}@redis-cost"
        registry = WorkerRegistry(worker_client(url, None), keys, f"{node}#1", LEASE_TTL_S)
        registry.register({"state": "ready", "slots": slots, "node": node})
        ids = registry.slot_ids(slots)
        active = {slot: f"bench_{i}" for i, slot in enumerate(ids)} if running else {}
        return cls(registry, node, ids if offered and not running else [], active)

    def once(self) -> None:
        self.registry.client.get(self.registry.keys.drain(self.node))
        self.registry.heartbeat(self.idle, self.active)


def heartbeats(url: str, slots: int, sessions: int, seconds: float) -> dict[str, Window]:
    """Worker beats back to back: bare, ``slots`` idle slots offered, ``sessions`` running; a
    gateway's liveness read of ``sessions`` leases."""
    from streaming import lua

    r = redis.Redis.from_url(url)
    out: dict[str, Window] = {}
    bare = Beat.of(url, 1, offered=False)
    out["bare"] = measure(r, seconds, bare.once)
    idle = Beat.of(url, slots)
    out["idle_slots"] = measure(r, seconds, idle.once)
    busy = Beat.of(url, sessions, running=True)
    out["sessions"] = measure(r, seconds, busy.once)
    live = r.register_script(lua.LIVENESS)
    leases = [busy.registry.keys.session_lease(sid) for sid in busy.active.values()]
    out["liveness"] = measure(r, seconds, lambda: live(keys=leases, args=[len(leases)]))
    for beat in (bare, idle, busy):
        keys = list(r.scan_iter(f"{beat.registry.keys.prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
    return out


# --------------------------------------------------------------------------- report


def run(args: argparse.Namespace) -> dict[str, Any]:
    url = shared_redis()
    stack = Stack(url, env={"OMNISERVE_QUEUE_UPDATE_INTERVAL_S": "3"})
    try:
        stack.start_gateway()
        stack.start_worker(args.slots)
        idle, adm = admission(stack, args.clients, args.seconds)
    finally:
        stack.stop()
    beats = heartbeats(url, args.slots, args.sessions, args.seconds)
    bare = beats["bare"].per_op_us() or 0.0
    busy = beats["sessions"].per_op_us() or 0.0
    lease_us = max(0.0, busy - bare) / max(args.sessions, 1)
    liveness_us = (beats["liveness"].per_op_us() or 0.0) / max(args.sessions, 1)
    per_session_s = 2 * (lease_us + liveness_us)  # both every 0.5 s (heartbeat_interval_s)
    return {
        "command": "python -m bench redis-cost " + " ".join(args.argv),
        "redis": redis.Redis.from_url(url).info("server")["redis_version"],
        "idle_stack": {
            "redis_cpu_pct": round(idle.cpu_s * 100 / idle.seconds, 2),
            "commands_per_s": round(idle.calls / idle.seconds, 1),
            "what": f"1 gateway, 1 worker of {args.slots} slots, no client",
        },
        "admission": {
            **adm.summary(idle),
            "commands_per_op_by_time": adm.top(idle),
            "clients": args.clients,
            "slots": args.slots,
        },
        "heartbeat": {
            "worker_beat_bare": beats["bare"].summary(),
            f"worker_beat_{args.slots}_idle_slots": beats["idle_slots"].summary(),
            f"worker_beat_{args.sessions}_sessions": beats["sessions"].summary(),
            f"gateway_liveness_{args.sessions}_leases": beats["liveness"].summary(),
            "session_lease_renewal_us": round(lease_us, 2),
            "session_liveness_read_us": round(liveness_us, 2),
            "per_session_us_per_s": round(per_session_s, 2),
            "sessions_per_core_heartbeats_alone": int(1e6 / per_session_s)
            if per_session_s
            else None,
        },
    }


def render(out: dict[str, Any]) -> str:
    a, h = out["admission"], out["heartbeat"]
    lines = [
        f"Redis {out['redis']}: its main thread's CPU over each window",
        f"idle stack ({out['idle_stack']['what']}): {out['idle_stack']['redis_cpu_pct']} % "
        f"of a core, {out['idle_stack']['commands_per_s']} commands/s",
        "",
        f"{'operation':<34} {'ops/s':>8} {'µs CPU/op':>10} {'cmds/op':>8} {'ceiling/s/core':>15}",
    ]

    def row(name: str, s: dict[str, Any]) -> str:
        return (
            f"{name:<34} {s['ops_per_s']:>8} {s['redis_cpu_us_per_op']!s:>10} "
            f"{s['commands_per_op']:>8} {s['ceiling_per_core_s']!s:>15}"
        )

    lines.append(row(f"admission ({a['clients']} clients, {a['slots']} slots)", a))
    top = ", ".join(f"{k} {v}" for k, v in a["commands_per_op_by_time"].items())
    lines.append(f"  its commands by time spent, calls per admission: {top}")
    for name, s in h.items():
        if isinstance(s, dict):
            lines.append(row(name.replace("_", " "), s))
    lines += [
        "",
        f"one session's lease renewal (worker): {h['session_lease_renewal_us']} µs, "
        f"its liveness read (gateway): {h['session_liveness_read_us']} µs, each twice a "
        f"second: {h['per_session_us_per_s']} µs/s, "
        f"{h['sessions_per_core_heartbeats_alone']} sessions per core on heartbeats alone",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench redis-cost", description=__doc__)
    p.add_argument("--seconds", type=float, default=10.0, help="each window")
    p.add_argument("--slots", type=int, default=4, help="the worker's slots")
    p.add_argument("--clients", type=int, default=8, help="clients cycling through admission")
    p.add_argument("--sessions", type=int, default=200, help="sessions of the busy beat")
    p.add_argument("--json", action="store_true", help="print the figures as JSON, last line")
    args = p.parse_args(argv)
    args.argv = argv
    install_cleanup()
    try:
        out = run(args)
    finally:
        kill_all()
    print(render(out))
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
