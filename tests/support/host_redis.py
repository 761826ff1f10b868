"""A redis-server on a host of a ``tests/support/netns.py`` network, bound to that host's own
address (a standalone server, or, with ``args``, one node of a Redis Cluster)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from omniserve.children import dies_with_parent
from omniserve.redis_server import redis_binary, stop_server, wait_answering
from tests.support.netns import Host


@dataclass
class HostRedis:
    """A redis-server process inside ``host`` (no persistence, reached at the host's address)."""

    host: Host
    port: int
    process: subprocess.Popen[bytes]
    workdir: str

    @property
    def url(self) -> str:
        return f"redis://{self.host.address}:{self.port}/0"

    def stop(self) -> None:
        stop_server(self.process, self.workdir)


def start_redis(
    host: Host, port: int = 6379, binary: str | None = None, args: Sequence[str] = ()
) -> HostRedis:
    """Start redis-server (``binary``, else the project's own) inside ``host`` on its address,
    with ``args`` added (``--cluster-enabled yes`` ...), and wait until it answers from here."""
    workdir = tempfile.mkdtemp(prefix="omniserve-host-redis-")
    command = [
        binary or redis_binary(),
        *("--bind", host.address, "--port", str(port), "--save", "", "--appendonly", "no"),
        *("--dir", workdir, "--maxmemory-policy", "noeviction", "--protected-mode", "no"),
        *args,
    ]
    proc = host.popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=dies_with_parent(),
    )
    server = HostRedis(host, port, proc, workdir)
    try:
        wait_answering(proc, server.url, f"redis-server on {host.name}")
    except RuntimeError:
        server.stop()
        raise
    return server


CLUSTER_SLOTS = 16384


def start_cluster(
    hosts: Sequence[Host],
    port: int = 6379,
    binary: str | None = None,
    args: Sequence[str] = (),
) -> list[HostRedis]:
    """A Redis Cluster of one primary on each of ``hosts`` (the slots split evenly, in order:
    ``shard_of``), each node announcing its host's own address (what clients are sent to by
    ``MOVED`` and ``CLUSTER SLOTS``), with ``args`` added; returned once every node says
    ``cluster_state:ok``. omniserve's data plane needs a Redis 7+ ``binary`` (sharded pub/sub:
    ``tests.support.redis_cluster.cluster_binaries``)."""
    nodes: list[HostRedis] = []
    try:
        for h in hosts:
            node = start_redis(h, port, binary, (*_cluster_args(h), *args))
            nodes.append(node)
        clients = [redis.Redis(n.host.address, n.port, socket_timeout=5) for n in nodes]
        share = CLUSTER_SLOTS // len(nodes)
        for i, client in enumerate(clients):
            last = CLUSTER_SLOTS if i == len(nodes) - 1 else (i + 1) * share
            client.execute_command("CLUSTER ADDSLOTS", *range(i * share, last))
            if i:
                client.execute_command("CLUSTER MEET", nodes[0].host.address, nodes[0].port)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [c.execute_command("CLUSTER INFO") for c in clients]  # (parsed: a dict)
            if all(
                i.get("cluster_state") == "ok"
                and int(i.get("cluster_known_nodes", 0)) == len(nodes)
                for i in infos
            ):
                return nodes
            time.sleep(0.1)
        raise RuntimeError(f"the cluster on {[h.name for h in hosts]} did not form within 30 s")
    except BaseException:
        for n in nodes:
            n.stop()
        raise


def shard_of(slot: int, shards: int) -> int:
    """Which of ``start_cluster``'s ``shards`` nodes serves ``slot``."""
    return min(shards - 1, slot // (CLUSTER_SLOTS // shards))


def _cluster_args(h: Host) -> tuple[str, ...]:
    return (
        *("--cluster-enabled", "yes", "--cluster-node-timeout", "3000"),
        *("--cluster-config-file", "nodes.conf", "--cluster-announce-ip", h.address),
    )
