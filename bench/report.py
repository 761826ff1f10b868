"""Percentiles, the printed table, the JSON file and the latency-vs-concurrency plot."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DOCS = Path(__file__).resolve().parent.parent / "docs"


def percentiles(
    values: list[float], qs: tuple[int, ...] = (50, 99), digits: int = 2
) -> dict[str, float | int | None]:
    """The ``qs`` percentiles (``p50``, ``p99`` ...), max and count of a list, rounded to
    ``digits``; None when empty."""
    if not values:
        return {"n": 0, **{f"p{q}": None for q in qs}, "max": None}
    v = sorted(values)

    def at(p: float) -> float:
        return round(v[min(len(v) - 1, round(p * (len(v) - 1)))], digits)

    return {"n": len(v), **{f"p{q}": at(q / 100) for q in qs}, "max": round(v[-1], digits)}


def machine() -> dict[str, Any]:
    """The machine the figures come from."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        import psutil

        mem_gib = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=DOCS.parent,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": mem_gib,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit,
    }


def write_json(name: str, data: dict[str, Any]) -> Path:
    """bench/results/<name>.json"""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.2f}" if abs(x) < 100 else f"{x:.0f}"
    return str(x)


def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    """A plain fixed-width table."""
    cells = [header] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [
        title,
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells[1:]]
    return "\n".join(lines)


def _server_cpu(level: dict[str, Any]) -> float | None:
    """The measured server's CPU % in a level: the gateway, or the baseline's server."""
    procs = level.get("procs") or {}
    proc = procs.get("gateway") or procs.get("server") or {}
    return proc.get("cpu_pct")


def plot_relay(
    levels: list[dict[str, Any]],
    baseline: list[dict[str, Any]],
    path: Path,
    capacity: dict[str, Any] | None = None,
) -> Path:
    """docs/bench_relay_latency.png: relay p50/p99 against concurrent sessions (every level the
    run measured, the capacity ramp included) above the gateway core's utilisation, so the
    capacity figure and its CPU read off one picture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = {d["sessions"]: d for d in levels}
    for d in (capacity or {}).get("levels", []):
        measured.setdefault(d["sessions"], d)
    stack = [measured[n] for n in sorted(measured)]
    fig, (ax, cpu) = plt.subplots(
        2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [2.2, 1]}
    )
    for data, label, server, color in (
        (stack, "omniserve (gateway+Redis+worker)", "omniserve gateway", "tab:blue"),
        (baseline, "baseline (in-process, no Redis)", "baseline server", "tab:gray"),
    ):
        pts = [(d["sessions"], d["latency_ms"]) for d in data if d["latency_ms"]["n"]]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1]["p50"] for p in pts], "o-", color=color, label=f"{label} p50")
        ax.plot(xs, [p[1]["p99"] for p in pts], "s--", color=color, label=f"{label} p99")
        use = [(d["sessions"], _server_cpu(d)) for d in data]
        use = [(n, c) for n, c in use if c is not None]
        if use:
            cpu.plot([u[0] for u in use], [u[1] for u in use], "o-", color=color, label=server)
    ax.axhline(50, color="tab:red", lw=0.8, ls=":", label="50 ms capacity bound")
    best = (capacity or {}).get("max_sessions")
    if best:
        for a in (ax, cpu):
            a.axvline(best, color="tab:green", lw=0.8, ls="-.")
        ax.text(best, 50, f" capacity {best}", color="tab:green", fontsize=7, va="bottom")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_yscale("log")
    ax.set_ylabel("emit -> client receive (ms)")
    ax.set_title("Relay latency per delta (scripted backend, loopback)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    cpu.set_xlabel("concurrent real-time audio duplex sessions")
    cpu.set_ylabel("server core (% of one)")
    cpu.grid(True, which="both", alpha=0.3)
    cpu.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(out: dict[str, Any]) -> str:
    """Every figure of a run as printed tables."""
    m = out["machine"]
    parts = [
        f"omniserve bench: {out['command']}\nmachine: {m['nproc']} CPU ({m['cpu']}), "
        f"{m['ram_gib']} GiB RAM, Python {m['python']}, commit {m['commit']}\n"
        f"backend: {out['backend']}\ngateway: {out.get('gateway')}"
    ]
    relay = out.get("relay")
    if relay:
        base = {b["sessions"]: b for b in relay["baseline"]}
        rows = []
        for lv in relay["levels"]:
            s, b = lv["latency_ms"], base.get(lv["sessions"], {}).get("latency_ms", {})
            e = lv.get("emit_latency_ms", {})  # (not in results written before it was measured)
            ratio = round(s["p50"] / b["p50"], 2) if s.get("p50") and b.get("p50") else None
            gw = lv["procs"]["gateway"]
            rows.append(
                [
                    lv["sessions"],
                    s["n"],
                    e.get("p50"),
                    e.get("p99"),
                    s["p50"],
                    s["p99"],
                    s["max"],
                    b.get("p50"),
                    b.get("p99"),
                    b.get("max"),
                    ratio,
                    lv["dropped_chunks"],
                    lv["errors"],
                    gw["cpu_pct"],
                    gw["rss_mib"],
                ]
            )
        parts.append(
            table(
                "Relay per delta (ms): worker emit -> client receive (emit), Redis publish ->"
                " client receive (p50, p99, max, p50 x); baseline = in-process server",
                [
                    "sessions",
                    "deltas",
                    "emit p50",
                    "emit p99",
                    "p50",
                    "p99",
                    "max",
                    "base p50",
                    "base p99",
                    "base max",
                    "p50 x",
                    "dropped",
                    "errors",
                    "gw cpu%",
                    "gw MiB",
                ],
                rows,
            )
        )
    cap = out.get("capacity")
    if cap:
        at = cap.get("at_max") or {}
        parts.append(
            table(
                "Capacity (one gateway; relay p99 < 50 ms, no dropped input chunk)",
                [
                    "max sessions",
                    "p99 ms",
                    "gw cpu%",
                    "cpu%/session",
                    "MiB/session",
                    "next level",
                    "why it failed",
                ],
                [
                    [
                        cap["max_sessions"],
                        (at.get("latency_ms") or {}).get("p99"),
                        at.get("gateway_cpu_pct"),
                        at.get("gateway_cpu_pct_per_session"),
                        at.get("gateway_rss_mib_per_session"),
                        cap["first_failing_level"],
                        cap["failing_reason"],
                    ]
                ],
            )
        )
    ch = out.get("chat")
    if ch:
        rows = []
        for kind in ("short_5_words", "long_200_words"):
            s, b = ch["stack"][kind], ch["baseline"][kind]
            rows.append(
                [
                    kind,
                    s["rounds"],
                    s["first_delta_ms"]["p50"],
                    b["first_delta_ms"]["p50"],
                    s["done_ms"]["p50"],
                    b["done_ms"]["p50"],
                    s["first_delta_ms"]["p99"],
                    s["done_ms"]["p99"],
                ]
            )
        parts.append(
            table(
                "Chat turn latency (ms, p50 unless noted): stack vs baseline",
                [
                    "answer",
                    "turns",
                    "first delta",
                    "base first",
                    "done",
                    "base done",
                    "first p99",
                    "done p99",
                ],
                rows,
            )
        )
    adm = out.get("admission")
    if adm:
        h = adm["handoff"]["slot_free_to_queue_done_ms"]
        parts.append(
            table(
                "Admission: slot released -> next client's session.queue_done (ms)",
                ["rounds", "p50", "p99", "max"],
                [[adm["handoff"]["matched"], h["p50"], h["p99"], h["max"]]],
            )
        )
        rows = [
            [
                u["driver"],
                u["waiting"],
                u["fill_s"],
                u["updates_per_s"],
                u["redis_commands_per_update"],
                u["gateway_cpu_ms_per_update"],
            ]
            for u in adm["updates"]
        ]
        parts.append(
            table(
                "Queue position updates (head leaves 1/s; refresh interval 3 s)",
                ["driver", "waiting", "fill s", "updates/s", "redis cmd/update", "cpu ms/update"],
                rows,
            )
        )
    return "\n\n".join(parts)
