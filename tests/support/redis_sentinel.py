"""A Redis primary, its replica and a Sentinel watching them: real servers on loopback, started
from the embedded Redis binary, for the failover test (``tests/faults/test_redis_sentinel.py``)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import redis

from omniserve.redis_server import free_port, kill_all, redis_binary, start_logged

SERVICE = "omni"
DOWN_AFTER_MS = 1000  # how long a silent primary takes to be judged down


class SentinelSet:
    """Two data nodes (the first the primary) and one Sentinel (quorum 1) on free ports."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="omniserve-sentinel-"))
        self.ports = [free_port(), free_port()]
        self.sentinel_port = free_port()
        self.down_port = free_port()  # a sentinel that never answers
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The URL omniserve is given: the sentinels and the service, never a data node. The
        first sentinel named is down (one of several may be), and the database is not the
        default one: every client, Celery's consumers too, must use it whichever it asks."""
        sentinels = f"127.0.0.1:{self.down_port},127.0.0.1:{self.sentinel_port}"
        return f"redis+sentinel://{sentinels}/{SERVICE}/3"

    def _start(self, port: int, *args: str) -> None:
        self.procs[port] = start_logged([redis_binary(), *args], self.workdir, port)

    def start_node(self, port: int, *args: str) -> None:
        """A data node on ``port`` (empty: nothing is saved), as a primary unless ``args`` say."""
        node = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self._start(port, "--port", str(port), *node, "--maxmemory-policy", "noeviction", *args)

    def role(self, port: int) -> str:
        """``master`` or ``slave``, as the node on ``port`` says (``""``: it does not answer)."""
        try:
            return str(redis.Redis(port=port, socket_timeout=2).info("replication")["role"])
        except redis.RedisError:
            return ""

    def start(self) -> None:
        primary, replica = self.ports
        self.start_node(primary)
        self.start_node(replica, "--replicaof", "127.0.0.1", str(primary))
        conf = self.workdir / "sentinel.conf"  # Sentinel rewrites its file: it must be its own
        conf.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
        )
        self._start(self.sentinel_port, str(conf), "--sentinel")
        self.wait_primary(primary, 20)
        replica_info = redis.Redis(port=replica)
        deadline = time.monotonic() + 20
        while replica_info.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica did not sync"
            time.sleep(0.1)

    def primary_port(self) -> int | None:
        """The port of the primary the Sentinel names now (None: it names none yet)."""
        try:
            host = redis.Redis(port=self.sentinel_port, socket_timeout=2)
            found = host.sentinel_get_master_addr_by_name(SERVICE)
        except redis.RedisError:
            return None
        return int(found[1]) if found else None

    def wait_primary(self, port: int, timeout: float) -> float:
        """Wait until the Sentinel names ``port`` the primary; the seconds it took."""
        t0 = time.monotonic()
        while self.primary_port() != port:
            assert time.monotonic() - t0 < timeout, f"no failover to {port} in {timeout} s"
            time.sleep(0.1)
        return time.monotonic() - t0

    def kill(self, port: int) -> None:
        """SIGKILL a data node."""
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(timeout=10)

    def stop(self) -> None:
        kill_all(self.procs, self.workdir)
