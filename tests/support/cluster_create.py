"""Six Redis nodes made one cluster the way a deployment's init step makes it
(``redis-cli --cluster create``, one replica each), checked to be three primaries and three
replicas.

Why: the compose override and the k8s example each start their cluster nodes from their own
rendered arguments, then form the cluster with the same command; this is that command and
its wait.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import redis

from omniserve.redis_server import redis_binary

FORMED_WITHIN_S = 60.0  # a backstop for a cluster that never forms


def create_cluster(ports: list[int], password: str) -> redis.Redis:
    """The nodes on ``ports`` (loopback, requiring ``password``) joined as one cluster whose
    state is ``ok``, three primaries and three replicas; a client of the first node."""
    cli = Path(redis_binary()).with_name("redis-cli")
    nodes = [f"127.0.0.1:{p}" for p in ports]
    created = subprocess.run(
        [str(cli), "--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes"],
        env={**os.environ, "REDISCLI_AUTH": password},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    client = redis.Redis(port=ports[0], password=password, decode_responses=True)
    deadline = time.monotonic() + FORMED_WITHIN_S
    while client.cluster("info")["cluster_state"] != "ok":
        assert time.monotonic() < deadline, client.cluster("info")
        time.sleep(0.2)
    roles = [redis.Redis(port=p, password=password).info("replication")["role"] for p in ports]
    assert sorted(roles) == ["master"] * 3 + ["slave"] * 3
    return client
