"""``python -m bench redis-footprint``: what a duplex session costs Redis, printed per session."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import redis

from bench import redis_footprint
from omniserve.redis_server import free_port, redis_binary, start_embedded
from tests.support.bench_run import run_bench
from tests.support.module_imports import ROOT


def test_a_small_run_prints_every_figure_per_session() -> None:
    pytest.importorskip("psutil")
    name = "pytest-redis-footprint"
    proc = run_bench(
        "redis-footprint",
        *("--sessions", "2", "--seconds", "3", "--warmup", "2", "--idle", "1"),
        *("--output", name),
    )
    assert "per command at 2 sessions" in proc.stdout, proc.stdout
    data = json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
    (level,) = data["levels"]
    assert level["started"] == 2 and not level["errors"]
    per = level["per_session"]
    assert per["commands_per_s"] > 0 and per["in_kib_s"] > 60  # at least the input audio
    assert per["out_kib_s"] > 60 and per["held_mib"] > 0
    assert {"log", "lease", "resume"} <= level["keys"].keys()
    assert {"evalsha", "xadd", "xread"} <= level["total"]["commands"].keys()


def test_every_primary_of_a_url_is_read() -> None:
    assert redis_footprint.seed_url("redis+cluster://h1:7000,h2:7001/") == "redis://h1:7000/0"
    assert redis_footprint.seed_url("rediss://:pw@h1:7000/2") == "rediss://:pw@h1:7000/0"
    server = start_embedded()
    try:
        nodes = redis_footprint.primaries(server.url)  # a plain Redis: its one node
        assert [node.port for node, _ in nodes] == [server.port]
        got = redis_footprint.read_all(nodes)
        assert got[nodes[0][0].name].commands > 0
    finally:
        server.stop()


def test_every_primary_of_a_cluster_is_read(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [
            redis_binary(),
            *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf")),
            *("--dir", str(tmp_path)),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the cluster node did not start"
                time.sleep(0.05)
        client.execute_command("CLUSTER ADDSLOTS", *range(16384))  # a cluster of one primary
        nodes = redis_footprint.primaries(f"redis+cluster://127.0.0.1:{port}/")
        assert [(node.host, node.port) for node, _ in nodes] == [("127.0.0.1", port)]
        assert nodes[0][1].ping()
    finally:
        server.terminate()
        server.wait(timeout=10)
