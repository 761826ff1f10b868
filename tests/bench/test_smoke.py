"""The benchmark suite's quickest path (``python -m bench --smoke``) reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository root; it must succeed."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_bench_smoke_reports_every_figure() -> None:
    pytest.importorskip("psutil")
    name = "pytest-smoke"
    proc = run_module("bench", "--smoke", "--output", name)
    data = json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
    for key in ("machine", "command", "relay", "capacity", "chat", "admission"):
        assert key in data
    relay = data["relay"]
    assert {"levels", "baseline", "ratio"} <= relay.keys()
    for level in relay["levels"]:
        assert {"p50", "p99", "max"} <= level["latency_ms"].keys()
        assert level["latency_ms"]["n"] > 0
        # timed from the worker's emit too: the same deltas, each from an earlier moment
        from_emit = level["emit_latency_ms"]
        assert from_emit["n"] == level["latency_ms"]["n"]
        assert from_emit["p50"] >= level["latency_ms"]["p50"]
        assert from_emit["max"] >= level["latency_ms"]["max"]
        assert level["dropped_chunks"] == 0
        assert {"cpu_pct", "rss_mib"} <= level["procs"]["gateway"].keys()
    assert relay["ratio"] and "p50_ratio" in relay["ratio"][0]
    cap = data["capacity"]
    assert cap["max_sessions"] >= 1
    assert {"gateway_cpu_pct_per_session", "gateway_rss_mib_per_session"} <= cap["at_max"].keys()
    for kind in ("short_5_words", "long_200_words"):
        for side in ("stack", "baseline"):
            assert data["chat"][side][kind]["first_delta_ms"]["p50"] is not None
            assert data["chat"][side][kind]["done_ms"]["p50"] is not None
    adm = data["admission"]
    assert adm["handoff"]["slot_free_to_queue_done_ms"]["p50"] is not None
    drivers = {(u["driver"], u["waiting"]) for u in adm["updates"]}
    assert any(d == "ws" for d, _ in drivers) and any(d == "direct" for d, _ in drivers)
    for u in adm["updates"]:
        assert u["updates_per_s"] > 0
        assert u["redis_commands_per_update"] is not None
    assert "pytest-smoke" in proc.stdout or "Relay" in proc.stdout


@pytest.mark.slow
def test_bench_ab_compares_two_revisions_side_by_side() -> None:
    """``python -m bench.ab``: a committed revision (from git) against the working tree, both
    gateways loaded at once; each round prints both figures and their ratio."""
    pytest.importorskip("psutil")
    proc = run_module("bench.ab", "HEAD", ".", "--sessions", "2", "--rounds", "1", "--seconds", "4")
    rounds = [line for line in proc.stdout.splitlines() if line.startswith("round 0:")]
    assert len(rounds) == 1, proc.stdout
    a, b = (float(rounds[0].split(f" {side} ")[1].split()[0]) for side in "AB")
    assert a > 0 and b > 0
    assert "B/A median" in proc.stdout


@pytest.mark.slow
def test_bench_loop_census_counts_the_gateways_callbacks() -> None:
    """``python -m bench.loop_census``: the gateway's own event loop, counted over the load's
    window: the sessions' receive loops are there, at about one step per client frame and
    reply (each client sends a frame a second)."""
    proc = run_module("bench.loop_census", "--sessions", "2", "--seconds", "4", "--top", "40")
    rows = dict(
        (line.split(maxsplit=1)[1], float(line.split()[0])) for line in proc.stdout.splitlines()[1:]
    )
    assert "callbacks/session-s" in proc.stdout.splitlines()[0], proc.stdout
    assert 0.5 < rows["task ClientSocket._receive_loop"] < 8, proc.stdout


def test_bench_publish_path_times_both_ways_of_writing_an_event() -> None:
    """``python -m bench.publish_path``: every event of both ways arrives (the script's and the
    pipeline's), each row with its delays in order and Redis's CPU per event."""
    proc = run_module("bench.publish_path", "--events", "30", "--rounds", "1")
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["script", "pipeline"], proc.stdout
    for _way, p50, p90, p99, redis_us in rows:
        assert 0 < float(p50) <= float(p90) <= float(p99), proc.stdout
        assert float(redis_us) >= 0, proc.stdout


def test_bench_hops_times_each_path_from_process_to_process() -> None:
    """``python -m bench.hops``: every path's messages arrive and its delays are in order."""
    proc = run_module("bench.hops", "--messages", "40", "--gap-ms", "2")
    rows = [line.rsplit(None, 3) for line in proc.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == [
        "socket, one core",
        "socket, two cores",
        "redis pub/sub",
        "pub/sub, raw RESP",
        "redis round trip",
    ], proc.stdout
    for _path, p50, p90, p99 in rows:
        assert 0 < float(p50) <= float(p90) <= float(p99), proc.stdout


def test_bench_input_path_costs_both_ways_of_writing_a_chunk() -> None:
    """``python -m bench.input_path``: both ways write every chunk and print their CPU cost."""
    proc = run_module("bench.input_path", "--chunks", "50", "--rounds", "1")
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["client", "link"], proc.stdout
    assert all(float(us) > 0 for _way, us in rows), proc.stdout


def test_a_stack_runs_the_source_tree_it_is_given(tmp_path: Path) -> None:
    """``Stack(root=...)`` (what ``bench.ab`` compares) runs that tree's code, not this one's:
    ``python -m`` puts the working directory first on ``sys.path``, ahead of ``PYTHONPATH``,
    so a child started from this checkout imported this checkout whatever ``PYTHONPATH`` said."""
    pytest.importorskip("psutil")
    from bench.stack import Stack, kill_all, shared_redis

    tree = tmp_path / "tree"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    mark = tmp_path / "imported-from"
    with (tree / "api" / "__init__.py").open("a") as fh:  # the gateway imports api
        fh.write(
            "\nimport os as _os, pathlib as _p\n"
            "_p.Path(_os.environ['BENCH_TREE_MARK']).write_text(__file__)\n"
        )
    stack = Stack(shared_redis(), env={"BENCH_TREE_MARK": str(mark)}, root=tree)
    try:
        stack.start_gateway()
    finally:
        stack.stop()
        kill_all()  # (the run's redis-server too: left running, it outlived the test suite)
    assert Path(mark.read_text()).resolve() == (tree / "api" / "__init__.py").resolve()
