"""``python -m bench redis-cost``: Redis's CPU per admission and per heartbeat, and the ceilings
they imply, read from the server's own counters."""

from __future__ import annotations

import json

import pytest

from tests.support.bench_run import run_bench


@pytest.mark.slow
def test_it_reports_the_cost_of_admissions_and_heartbeats() -> None:
    proc = run_bench("redis-cost", "--seconds", "1.5", "--sessions", "20", "--json")
    assert "sessions per core on heartbeats alone" in proc.stdout, proc.stdout
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    admission = out["admission"]
    assert admission["ops"] > 0 and admission["redis_cpu_us_per_op"] > 0
    assert admission["ceiling_per_core_s"] > 0 and admission["commands_per_op"] > 1
    assert "evalsha" in admission["commands_per_op_by_time"]
    beats = out["heartbeat"]
    for name in ("worker_beat_bare", "worker_beat_4_idle_slots", "worker_beat_20_sessions"):
        assert beats[name]["ops"] > 0 and beats[name]["ceiling_per_core_s"] > 0, name
    # each running session renews its lease and its slot hold on every beat
    per_beat = beats["worker_beat_20_sessions"]["commands_per_op"]
    assert per_beat >= beats["worker_beat_bare"]["commands_per_op"] + 2 * 20
    assert beats["gateway_liveness_20_leases"]["commands_per_op"] >= 20
    assert beats["sessions_per_core_heartbeats_alone"] > 0
