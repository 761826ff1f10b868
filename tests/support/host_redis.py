"""A redis-server on a host of a ``tests/support/netns.py`` network, bound to that host's own
address (a standalone server, or, with ``args``, one node of a Redis Cluster)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from omniserve.children import dies_with_parent
from omniserve.redis_server import reachable, redis_binary
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
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)


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
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server on {host.name} exited with code {proc.returncode}")
        if reachable(server.url, 0.2):
            return server
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"redis-server on {host.name} did not start within 10 s")
