"""The regression guard: ``python -m bench --check`` against the committed figures.

Every figure is a ratio of omniserve to the baseline server measured in the same run (the bare
in-process WebSocket server of bench/baseline.py, on the same pinned core), never an absolute
time, so a slower or busier machine moves both sides and the guard stays meaningful. Admission
handoff has no baseline counterpart, so it is reported by the full run but not guarded.

A figure regresses when ``measured > max(expected, 1) * (1 + margin)``: a committed ratio below
parity (omniserve faster than the baseline in a lucky run) does not make the guard stricter than
"no worse than the baseline plus the margin". Margins (documented in
docs/BENCHMARKS.md): 0.5 for the quick run, 2.0 for the smoke form CI runs, where one or two
sessions on a shared CI machine give noisy ratios and only a gross regression (a codec or
compression mistake that doubles the gateway's work) should fail the build.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXPECTED = Path(__file__).resolve().parent / "expected.json"
# a percentile of fewer samples is mostly chance: p50 is guarded from 20 deltas, p99 from 200
MIN_SAMPLES = {"p50": 20, "p99": 200}
MARGINS = {"quick": 0.5, "smoke": 2.0}


@dataclass(frozen=True)
class Row:
    """One guarded figure."""

    name: str
    expected: float
    measured: float
    limit: float

    @property
    def ok(self) -> bool:
        return self.measured <= self.limit


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 3)


def figures(out: dict[str, Any]) -> dict[str, float]:
    """The guarded ratios of one run's results (bench/results/*.json shape)."""
    figs: dict[str, float | None] = {}
    relay = out.get("relay") or {}
    base = {b["sessions"]: b for b in relay.get("baseline", [])}
    levels = {lv["sessions"]: lv for lv in relay.get("levels", [])}
    for r in relay.get("ratio", []):
        n = r["sessions"]
        samples = min(levels[n]["latency_ms"]["n"], base[n]["latency_ms"]["n"])
        for q in ("p50", "p99"):
            if samples >= MIN_SAMPLES[q]:
                figs[f"relay_{q}_ratio_{n}"] = r[f"{q}_ratio"]
    for lv in relay.get("levels", []):
        b = base.get(lv["sessions"])
        if b and "server_cpu_pct_per_session" in b:
            figs[f"gateway_cpu_ratio_{lv['sessions']}"] = _ratio(
                lv["gateway_cpu_pct_per_session"], b["server_cpu_pct_per_session"]
            )
    chat = out.get("chat")
    if chat:
        for kind, key in (("short_5_words", "first_delta_ms"), ("long_200_words", "done_ms")):
            figs[f"chat_{kind}_{key}_ratio"] = _ratio(
                chat["stack"][kind][key]["p50"], chat["baseline"][kind][key]["p50"]
            )
    return {k: v for k, v in figs.items() if v is not None}


def compare(measured: dict[str, float], expected: dict[str, float], margin: float) -> list[Row]:
    """Rows for every figure both runs have (a figure only one side has is not guarded)."""
    return [
        Row(name, expected[name], measured[name], round(max(expected[name], 1.0) * (1 + margin), 3))
        for name in sorted(expected)
        if name in measured
    ]


def render(rows: list[Row], margin: float) -> str:
    lines = [
        f"Regression guard (ratios to the baseline in the same run; margin {margin:.0%})",
        f"  {'figure':<44} {'committed':>9} {'limit':>8} {'measured':>9}",
    ]
    for r in rows:
        mark = "ok" if r.ok else "REGRESSION"
        lines.append(
            f"  {r.name:<44} {r.expected:>9.3f} {r.limit:>8.3f} {r.measured:>9.3f}  {mark}"
        )
    return "\n".join(lines)


def load_expected(mode: str, path: Path = EXPECTED) -> dict[str, float] | None:
    """The committed figures of one mode (quick or smoke), or None when there are none."""
    if not path.exists():
        return None
    entry = json.loads(path.read_text()).get(mode)
    return dict(entry["figures"]) if entry else None


def save_expected(
    mode: str, figs: dict[str, float], out: dict[str, Any], path: Path = EXPECTED
) -> None:
    """Record this run's figures as the committed ones for ``mode`` (with where they came from)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data[mode] = {
        "figures": figs,
        "command": out.get("command"),
        "machine": out.get("machine"),
        "pinning": out.get("pinning"),
        "started": out.get("started"),
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
