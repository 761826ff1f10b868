"""Run the omniserve benchmarks on loopback with the scripted backend (fixed output timing).

    python -m bench [--quick | --smoke] [--only relay,capacity,chat,admission] [--output NAME]
    python -m bench --check [--smoke] [--update-expected]   the regression guard (bench/check.py)
    python -m bench pocket [ARGS]      the pocket-backend latency benchmark (needs extra [pocket])
    python -m bench soak [--minutes N] many sessions under random faults (bench/soak.py)
    python -m bench queue-estimate     wait estimates against actual waits (bench/queue_estimate.py)
    python -m bench rollover [--minutes N]  a call longer than the context (bench/rollover.py)
    python -m bench redis-cost         Redis CPU per admission, per heartbeat (bench/redis_cost.py)
    python -m bench redis-footprint    what a duplex session costs Redis (bench/redis_footprint.py)
    python -m bench redis-floor        the floor under a session's Redis CPU (bench/redis_floor.py)
    python -m bench shards             the same load on 1 and 3 cluster shards (bench/shards.py)

Starts a private redis-server, gateways, scripted workers, a pub/sub tap and the bare baseline
server, all on 127.0.0.1; every process is killed when the run ends (also on Ctrl-C or error).
Prints tables and writes bench/results/<NAME>.json (and docs/bench_relay_latency.png with --plot).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
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


QUICK = Config([1, 10, 100], [150, 200, 300], 4.0, 1.5, (30, 3), 8, 1000, [1000, 10000], 4.0)
FULL = Config(
    [1, 10, 50, 100],
    [150, 200, 250, 300, 400, 500, 600, 800],
    15.0,
    3.0,
    (60, 5),
    30,
    1000,
    [1000, 10000],
    10.0,
)
SMOKE = Config([1, 2], [], 1.5, 0.5, (2, 1), 2, 20, [50, 100], 1.5)
# the guard's smoke form (CI): enough deltas (~50 per level) for a p50 that means something
CHECK_SMOKE = Config([1, 10], [], 5.0, 1.0, (5, 1), 2, 20, [50, 100], 1.5)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="short windows (< 3 min in all)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--output", help="results file name (bench/results/NAME.json)")
    p.add_argument("--plot", action="store_true", help="write docs/bench_relay_latency.png")
    p.add_argument(
        "--check",
        action="store_true",
        help="regression guard: a quick run (or --smoke) of relay and chat, compared as ratios "
        "to the baseline with the committed figures (bench/expected.json); exit 1 on regression",
    )
    p.add_argument(
        "--update-expected",
        action="store_true",
        help="with --check: record this run's figures as the committed ones",
    )
    p.add_argument("--margin", type=float, help="with --check: override the allowed margin")
    p.add_argument("--expected", help="with --check: the committed figures file to use")
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the gateway (and baseline) to one core and the rest to the others",
    )
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
    p.add_argument(
        "--record",
        action="store_true",
        help="the gateway records every session (OMNISERVE_RECORDINGS=true, a temporary store)",
    )
    return p.parse_args(argv)


def run_relay_capacity(
    cfg: Config, parts: set[str], out: dict[str, Any], deflate: bool = False, record: bool = False
) -> None:
    """Relay levels, capacity ramp, baseline comparison and chat, on one stack."""
    import tempfile

    from bench import capacity, chat, relay
    from bench.stack import Stack, shared_redis, start_baseline, stop

    slots = max(cfg.levels + cfg.ramp)
    store = tempfile.mkdtemp(prefix="omniserve-bench-recordings-")
    env = {"OMNISERVE_RECORDINGS": "true", "OMNISERVE_RECORDINGS_URL": store} if record else {}
    stack = Stack(shared_redis(), deflate=deflate, env=env)
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
                    f"p99 {lv['latency_ms']['p99']} ms (from the worker's emit: "
                    f"{lv['emit_latency_ms'].get('p50')} / {lv['emit_latency_ms'].get('p99')}), "
                    f"dropped {lv['dropped_chunks']}, "
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
                b = relay.baseline_level(base_url, n, cfg.seconds, cfg.warmup, base_proc.pid)
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
        shutil.rmtree(store, ignore_errors=True)


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
    if argv and argv[0] == "soak":
        from bench import soak

        return soak.main(argv[1:])
    if argv and argv[0] == "queue-estimate":
        from bench import queue_estimate

        return queue_estimate.main(argv[1:])
    if argv and argv[0] == "shards":
        from bench import shards

        return shards.main(argv[1:])
    if argv and argv[0] == "redis-footprint":
        from bench import redis_footprint

        return redis_footprint.main(argv[1:])
    if argv and argv[0] == "redis-floor":
        from bench import redis_floor

        return redis_floor.main(argv[1:])
    if argv and argv[0] == "rollover":
        from bench import rollover

        return rollover.main(argv[1:])
    if argv and argv[0] == "redis-cost":
        from bench import redis_cost

        return redis_cost.main(argv[1:])
    args = parse(argv)
    from bench import pinning, report
    from bench.stack import install_cleanup

    install_cleanup()
    pin = pinning.plan(not args.no_pin)
    pinning.activate(pin)
    if args.no_deflate:
        from bench import duplex_load

        duplex_load.COMPRESSION[0] = None
    cfg = SMOKE if args.smoke else QUICK if (args.quick or args.check) else FULL
    if args.check and args.smoke:
        cfg = CHECK_SMOKE
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    if args.check:
        parts = {"relay", "chat"}  # the parts with a same-run baseline
    unknown = parts - set(PARTS)
    if unknown:
        print(f"unknown part(s): {sorted(unknown)}", file=sys.stderr)
        return 2
    mode = "smoke" if args.smoke else "quick" if (args.quick or args.check) else "full"
    name = args.output or (f"check-{mode}" if args.check else mode)
    header: dict[str, Any] = {
        "command": "python -m bench " + " ".join(argv),
        "machine": report.machine(),
        "backend": "scripted (deterministic, model-free): trigger=always, 1 s of 24 kHz audio "
        "per step, token_delay_s=0.01",
        "config": cfg.__dict__,
        "gateway": "omniserve gateway" + (" with permessage-deflate" if args.deflate else ""),
        "client_permessage_deflate": not args.no_deflate,
        "recordings": args.record,
        "pinning": pin.describe() if pin else "not pinned",
    }
    out = _measure(cfg, parts, args.deflate, header, name, args.record)
    if args.plot and "relay" in out:
        png = report.plot_relay(
            out["relay"]["levels"],
            out["relay"]["baseline"],
            report.DOCS / "bench_relay_latency.png",
            out.get("capacity"),
        )
        print(f"plot: {png}")
    if not args.check:
        return 0
    rc = _check(args, mode, out)
    if rc == 1:  # noise or a real regression: a regression must show in a second run too
        print("re-measuring once to confirm", file=sys.stderr)
        confirm = _measure(cfg, parts, args.deflate, header, name + "-confirm", args.record)
        rc = _check(args, mode, confirm)
    return rc


def _measure(
    cfg: Config,
    parts: set[str],
    deflate: bool,
    header: dict[str, Any],
    name: str,
    record: bool = False,
) -> dict[str, Any]:
    """One run of the chosen parts on a fresh private Redis; prints and writes the results."""
    from bench import report
    from bench.stack import kill_all

    out = dict(header, started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    t0 = time.perf_counter()
    try:
        if parts & {"relay", "capacity", "chat"}:
            run_relay_capacity(cfg, parts, out, deflate, record)
        if "admission" in parts:
            run_admission(cfg, out)
    finally:
        kill_all()
    out["elapsed_s"] = round(time.perf_counter() - t0, 1)
    path = report.write_json(name, out)
    print(report.render(out))
    print(f"results: {path}  ({out['elapsed_s']} s)")
    return out


def _check(args: argparse.Namespace, mode: str, out: dict[str, Any]) -> int:
    """Compare a run with the committed figures: 0 within the margin, 1 on a regression,
    2 when there is nothing to compare with."""
    from bench import check

    figs = check.figures(out)
    path = Path(args.expected) if args.expected else check.EXPECTED
    if args.update_expected:
        check.save_expected(mode, figs, out, path)
        print(f"committed figures for {mode} written to {path}")
        return 0
    expected = check.load_expected(mode, path)
    if expected is None:
        print(f"no committed {mode} figures in {path}; run with --update-expected")
        return 2
    margin = args.margin if args.margin is not None else check.MARGINS[mode]
    rows = check.compare(figs, expected, margin)
    print(check.render(rows, margin))
    if not rows:
        print("no figure in common with the committed ones")
        return 2
    bad = [r.name for r in rows if not r.ok]
    print("regressions: " + ", ".join(bad) if bad else "no regression")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
