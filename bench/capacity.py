"""Capacity: the most concurrent real-time duplex sessions one gateway serves within the bound.

A level passes when every session started, relay p99 < 50 ms, no input chunk was dropped
(``dropped_chunks`` in delta metrics) and no error frame arrived. Levels rise until one fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

P99_BOUND_MS = 50.0


def passes(level: dict[str, Any]) -> bool:
    """Whether a measured level is within the capacity bound."""
    p99 = level["latency_ms"]["p99"]
    return (
        level["sessions_started"] == level["sessions"]
        and level["errors"] == 0
        and level["dropped_chunks"] == 0
        and p99 is not None
        and p99 < P99_BOUND_MS
    )


def search(
    measure: Callable[[int], dict[str, Any]],
    measured: list[dict[str, Any]],
    ramp: list[int],
    bisect: int = 2,
) -> dict[str, Any]:
    """Continue from already ``measured`` levels up the ``ramp`` until a level fails, then
    bisect between the best passing level and the first failing one ``bisect`` times."""
    levels = list(measured)
    if all(passes(x) for x in levels):
        for n in ramp:
            if levels and n <= levels[-1]["sessions"]:
                continue
            lv = measure(n)
            levels.append(lv)
            if not passes(lv):
                break
    for _ in range(bisect):  # narrow the gap between the best pass and the first failure
        good = max((x["sessions"] for x in levels if passes(x)), default=0)
        bad = min((x["sessions"] for x in levels if not passes(x)), default=None)
        if bad is None or bad - good <= max(2, good // 10):
            break
        lv = measure((good + bad) // 2)
        levels.append(lv)
    levels.sort(key=lambda x: x["sessions"])
    ok = [x for x in levels if passes(x)]
    best = max(ok, key=lambda x: x["sessions"]) if ok else None
    first_fail = next(
        (x for x in levels if not passes(x) and x["sessions"] > (best["sessions"] if best else 0)),
        None,
    )
    out: dict[str, Any] = {
        "bound": {"relay_p99_ms_below": P99_BOUND_MS, "dropped_chunks": 0},
        "max_sessions": best["sessions"] if best else 0,
        "first_failing_level": first_fail["sessions"] if first_fail else None,
        "failing_reason": _reason(first_fail) if first_fail else "ramp exhausted",
        "levels_tried": [x["sessions"] for x in levels],
    }
    if best:
        out["at_max"] = {
            "latency_ms": best["latency_ms"],
            "gateway_cpu_pct": best["procs"]["gateway"]["cpu_pct"],
            "gateway_rss_mib": best["procs"]["gateway"]["rss_mib"],
            "gateway_cpu_pct_per_session": best["gateway_cpu_pct_per_session"],
            "gateway_rss_mib_per_session": best["gateway_rss_mib_per_session"],
            "procs": best["procs"],
        }
    out["levels"] = levels
    return out


def _reason(level: dict[str, Any]) -> str:
    why = []
    if level["sessions_started"] != level["sessions"]:
        why.append(f"only {level['sessions_started']}/{level['sessions']} sessions started")
    if level["errors"]:
        why.append(f"{level['errors']} errors {level['error_samples']}")
    if level["dropped_chunks"]:
        why.append(f"{level['dropped_chunks']} input chunks dropped")
    p99 = level["latency_ms"]["p99"]
    if p99 is None or p99 >= P99_BOUND_MS:
        why.append(f"relay p99 {p99} ms")
    return "; ".join(why)
