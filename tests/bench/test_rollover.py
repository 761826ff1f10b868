"""``python -m bench rollover``: a call through several rollovers, its figures printed."""

from __future__ import annotations

import json

from tests.support.bench_run import run_bench


def test_a_short_call_rolls_over_and_reports_its_figures() -> None:
    proc = run_bench("rollover", "--minutes", "2", "--kv-tokens", "300")
    assert "rollovers, context_full: False, errors: 0" in proc.stdout, proc.stdout
    proc = run_bench("rollover", "--minutes", "1", "--kv-tokens", "300", "--json")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rollovers"] >= 2 and not out["context_full"] and not out["errors"]
    assert out["rollover_gap_ms"]["p50"] is not None
    assert set(out["worker_rss_mib"]) == {"first_rollover", "end"}
