"""``python -m bench redis-floor``: what a round trip and one session's audio cost Redis's CPU,
with the caller on Redis's vCPU and on another, read from the server's own counters."""

from __future__ import annotations

import json
import os

from tests.support.bench_run import run_bench

ROWS = ("round trip", "input", "input, 1 KB", "output", "output, 1 KB", "output, pipeline")


def test_it_reports_each_operation_for_each_placement() -> None:
    proc = run_bench("redis-floor", "--rounds", "40", "--json")
    assert "floor: one input + one output" in proc.stdout, proc.stdout
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    placements = out["placements"]
    expected = {"same vCPU", "other vCPU"} if len(os.sched_getaffinity(0)) > 1 else {"same vCPU"}
    assert set(placements) == expected
    for row in placements.values():
        assert all(row[name] >= 0 for name in ROWS), row
        assert row["floor per session-second"] == row["input"] + row["output"]
