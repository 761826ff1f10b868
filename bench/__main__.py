"""Run the omniserve benchmarks on loopback with the scripted backend (fixed output timing).

    python -m bench [--quick | --smoke] [--only relay,capacity,chat,admission] [--output NAME]
    python -m bench pocket [ARGS]      the pocket-backend latency benchmark (needs extra [pocket])

Starts a private redis-server, gateways, scripted workers, a pub/sub tap and the bare baseline
server, all on 127.0.0.1; every process is killed when the run ends (also on Ctrl-C or error).
Prints tables and writes bench/results/<NAME>.json (and docs/bench_relay_latency.png with --plot).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

PARTS = ("relay", "capacity", "chat", "admission")


@dataclass
class Config:
    """Sizes and durations of one run."""

    levels: list[int]
    ramp: list[int]
    seconds: float
    warmup: float
    chat_rounds: tuple[int, int]
    handoff_rounds: int
    ws_waiting: int
    direct_waiting: list[int]
    update_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


QUICK = Config([1, 10, 100], [150, 200, 300], 4.0, 1.5, (5, 2), 8, 1000, [1000, 10000], 4.0)
FULL = Config(
    [1, 10, 50, 100],
    [150, 200, 250, 300, 400, 500, 600, 800],
    15.0,
    3.0,
    (20, 5),
    30,
    1000,
    [1000, 10000],
    10.0,
)
SMOKE = Config([1, 2], [], 1.5, 0.5, (2, 1), 2, 20, [50, 100], 1.5)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="short windows (< 3 min in all)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--output", help="results file name (bench/results/NAME.json)")
    p.add_argument("--plot", action="store_true", help="write docs/bench_relay_latency.png")
    p.add_argument(
        "--no-deflate",
        action="store_true",
        help="duplex clients do not offer permessage-deflate (browsers do)",
    )
    p.add_argument(
        "--deflate",
        action="store_true",
        help="gateway and baseline negotiate permessage-deflate "
        "(OMNISERVE_WS_DEFLATE=true; off by default)",
    )
    return p.parse_args(argv)


def run_relay_capacity(
    cfg: Config, parts: set[str], out: dict[str, Any], deflate: bool = False
) -> None:
    """Relay levels, capacity ramp, baseline comparison and chat, on one stack."""
    from bench import capacity, chat, relay
    from bench.stack import Stack, shared_redis, start_baseline, stop

    slots = max(cfg.levels + cfg.ramp)
    stack = Stack(shared_redis(), deflate=deflate)
    stack.start_gateway()
    stack.start_workers(slots)
    base_proc, base_port = start_baseline(deflate)
    base_url = f"ws://127.0.0.1:{base_port}"
    try:
        if parts & {"relay", "capacity"}:

            def measure(n: int) -> dict[str, Any]:
                lv = relay.stack_level(stack, n, cfg.seconds, cfg.warmup)
                _progress(
                    f"relay {n:>4} sessions: p50 {lv['latency_ms']['p50']} "
                    f"p99 {lv['latency_ms']['p99']} ms, dropped {lv['dropped_chunks']}, "
                    f"gateway cpu {lv['procs']['gateway']['cpu_pct']}%"
                )
                return lv

            levels = [measure(n) for n in cfg.levels]
            ramp = cfg.ramp if "capacity" in parts else []
            cap = capacity.search(measure, levels, ramp)
            levels = cap.pop("levels")
            base = []
            wanted = sorted(
                set(cfg.levels) | ({cap["max_sessions"]} if cap["max_sessions"] else set())
            )
            for n in wanted:
                b = relay.baseline_level(base_url, n, cfg.seconds, cfg.warmup)
                _progress(
                    f"baseline {n:>4} sessions: p50 {b['latency_ms']['p50']} "
                    f"p99 {b['latency_ms']['p99']} ms"
                )
                base.append(b)
            out["relay"] = {
                "levels": levels,
                "baseline": base,
                "ratio": _ratios(levels, base),
                "max_sessions_level": cap["max_sessions"],
            }
            if "capacity" in parts:
                out["capacity"] = cap
        if "chat" in parts:
            out["chat"] = {
                "stack": chat.measure(stack.url, *cfg.chat_rounds),
                "baseline": chat.measure(base_url, *cfg.chat_rounds),
            }
            _progress("chat done")
    finally:
        stack.stop()
        stop(base_proc)


def _ratios(levels: list[dict[str, Any]], base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_n = {b["sessions"]: b for b in base}
    out = []
    for lv in levels:
        b = by_n.get(lv["sessions"])
        if not b or not b["latency_ms"]["n"] or not lv["latency_ms"]["n"]:
            continue
        s, bl = lv["latency_ms"], b["latency_ms"]
        out.append(
            {
                "sessions": lv["sessions"],
                "p50_ratio": round(s["p50"] / max(bl["p50"], 1e-3), 2),
                "p99_ratio": round(s["p99"] / max(bl["p99"], 1e-3), 2),
            }
        )
    return out


def run_admission(cfg: Config, out: dict[str, Any]) -> None:
    """Handoff latency (1 slot) and queue-update cost (no slots)."""
    from bench import admission
    from bench.stack import Stack, shared_redis

    url = shared_redis()
    one = Stack(url, env={"OMNISERVE_QUEUE_UPDATE_INTERVAL_S": "3"})
    try:
        one.start_gateway()
        one.start_worker(1)
        out["admission"] = {"handoff": admission.handoff(one, cfg.handoff_rounds)}
    finally:
        one.stop()
    _progress(f"handoff: {out['admission']['handoff']['slot_free_to_queue_done_ms']}")
    none = Stack(
        url, env={"OMNISERVE_MAX_QUEUE": "20000", "OMNISERVE_QUEUE_UPDATE_INTERVAL_S": "3"}
    )
    updates = []
    try:
        none.start_gateway()
        none.start_worker(1)
        updates.append(admission.updates_ws(none, cfg.ws_waiting, cfg.update_seconds))
        _progress(f"updates ws {cfg.ws_waiting}: {updates[-1]['updates_per_s']}/s")
    finally:
        none.stop()
    for n in cfg.direct_waiting:
        updates.append(admission.updates_direct(url, n, cfg.update_seconds))
        _progress(f"updates direct {n}: {updates[-1]['updates_per_s']}/s")
    out["admission"]["updates"] = updates


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench`` and ``omniserve bench``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "pocket":
        from bench import pocket_latency

        return pocket_latency.main(argv[1:])
    args = parse(argv)
    from bench import report
    from bench.stack import install_cleanup, kill_all

    install_cleanup()
    if args.no_deflate:
        from bench import duplex_load

        duplex_load.COMPRESSION[0] = None
    cfg = QUICK if args.quick else SMOKE if args.smoke else FULL
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        print(f"unknown part(s): {sorted(unknown)}", file=sys.stderr)
        return 2
    name = args.output or ("quick" if args.quick else "smoke" if args.smoke else "full")
    out: dict[str, Any] = {
        "command": "python -m bench " + " ".join(argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": report.machine(),
        "backend": "scripted (deterministic, model-free): trigger=always, 1 s of 24 kHz audio "
        "per step, token_delay_s=0.01",
        "config": cfg.__dict__,
        "gateway": "omniserve gateway" + (" with permessage-deflate" if args.deflate else ""),
        "client_permessage_deflate": not args.no_deflate,
    }
    t0 = time.perf_counter()
    try:
        if parts & {"relay", "capacity", "chat"}:
            run_relay_capacity(cfg, parts, out, args.deflate)
        if "admission" in parts:
            run_admission(cfg, out)
    finally:
        kill_all()
    out["elapsed_s"] = round(time.perf_counter() - t0, 1)
    path = report.write_json(name, out)
    print(report.render(out))
    if args.plot and "relay" in out:
        png = report.plot_relay(
            out["relay"]["levels"],
            out["relay"]["baseline"],
            report.DOCS / "bench_relay_latency.png",
        )
        print(f"plot: {png}")
    print(f"results: {path}  ({out['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
