"""streaming/cluster_check.py: why a process given a Redis Cluster URL cannot start, told at
once or within its bound (a cluster that is found: tests/e2e/test_redis_cluster.py)."""

from __future__ import annotations

import time

from omniserve.redis_server import free_port
from streaming.cluster_check import data_plane_problem

BROKER = "redis://127.0.0.1:6379/0"


def test_other_urls_are_not_judged() -> None:
    assert data_plane_problem("redis://127.0.0.1:1/0", None) is None
    assert data_plane_problem("redis+sentinel://127.0.0.1:1/omni", None) is None


def test_a_cluster_needs_a_broker_of_its_own() -> None:
    url = "redis+cluster://127.0.0.1:7000/"
    assert "set OMNISERVE_BROKER_URL" in str(data_plane_problem(url, None))
    assert "cannot be a Redis Cluster" in str(data_plane_problem(url, url))


def test_a_malformed_url_is_named() -> None:
    problem = str(data_plane_problem("redis+cluster://h:7000/3", BROKER))
    assert problem.startswith("OMNISERVE_REDIS_URL:") and "database" in problem


def test_nobody_answering_is_told_within_the_bound() -> None:
    url = f"redis+cluster://:pw@127.0.0.1:{free_port()}/"
    began = time.monotonic()
    problem = str(data_plane_problem(url, BROKER, within_s=1.0))
    assert time.monotonic() - began < 10  # the bound and one round of attempts, never a hang
    assert problem.startswith("no Redis Cluster at") and "pw" not in problem, problem


def test_a_server_not_in_cluster_mode_is_told_at_once(redis_server: str) -> None:
    plain = redis_server.replace("redis://", "redis+cluster://").rsplit("/", 1)[0]
    assert "not in cluster mode" in str(data_plane_problem(plain, BROKER))
