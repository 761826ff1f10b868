"""Run the Redis and Flower commands of a manifest for real, on loopback, and probe them.

Shared by the Kubernetes and Compose tests: both must start Redis with a password, a memory cap
below the container limit and noeviction, and Flower behind basic auth. The command lines are
taken from the rendered manifests; only the listening address, port and data directory are
replaced, since the container's would not fit this machine.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import redis

from omniserve.redis_server import free_port, redis_binary
from tests.support.stack import LOG_DIR, ROOT


def cluster_node_port() -> int:
    """A free port for a Redis Cluster node: its cluster bus listens 10000 above it, which must
    be a port too (and free)."""
    while True:
        port = free_port()
        if port + 10000 <= 65535:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


@contextmanager
def redis_from_args(args: list[str], binary: str | None = None) -> Iterator[int]:
    """Start ``redis-server`` with a manifest's arguments (after the program name) on loopback
    (``binary``: another server than the embedded one, for options it lacks; a cluster node
    gets a port whose bus port exists)."""
    assert args[0] == "redis-server", args
    port = cluster_node_port() if "--cluster-enabled" in args else free_port()
    workdir = tempfile.mkdtemp(prefix="omniserve-deploy-redis-")
    proc = subprocess.Popen(
        [
            binary or redis_binary(),
            *args[1:],
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=port, socket_timeout=1).ping()
            except redis.AuthenticationError:
                break  # up, and asking for a password
            except redis.ResponseError as exc:  # NOAUTH on servers that answer PING so
                if "NOAUTH" in str(exc):
                    break
                raise
            except redis.ConnectionError:
                assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
                continue
            else:
                break  # no password: the caller's assertions will say so
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def on_port(url: str, port: int) -> str:
    """A Redis URL with its host and port replaced by 127.0.0.1:port (credentials kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def assert_redis_hardened(port: int, password: str, limit_bytes: int) -> None:
    """Password required, maxmemory set below the container limit, noeviction, no persistence."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:  # plain RESP, no HELLO
        raw.sendall(b"PING\r\n")
        answer = raw.recv(256)
    assert answer.startswith(b"-NOAUTH"), answer
    client = redis.Redis(port=port, password=password, socket_timeout=5, decode_responses=True)
    assert client.ping()
    cfg = client.config_get("*")
    maxmemory = int(cfg["maxmemory"])
    assert 0 < maxmemory <= 0.8 * limit_bytes, (maxmemory, limit_bytes)
    assert cfg["maxmemory-policy"] == "noeviction"
    assert cfg["save"] == ""
    assert cfg["appendonly"] == "no"


@contextmanager
def flower_from_command(command: list[str], env: dict[str, str]) -> Iterator[str]:
    """Start a manifest's Flower command with its environment; yields Flower's base URL."""
    port = free_port()
    argv = [a for a in command if not a.startswith(("--port", "--address"))]
    assert argv[:2] == ["celery", "-A"], argv
    argv = [sys.executable, "-m", *argv, f"--port={port}", "--address=127.0.0.1"]
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("OMNISERVE_", "FLOWER_"))}
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = Path(LOG_DIR) / f"deploy-flower-{port}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            argv,
            env={**keep, **env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"flower exited:\n{log.read_text(errors='replace')}"
            try:
                httpx.get(url, timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def assert_flower_requires_login(url: str, user_password: str) -> None:
    """No page or API without the login; the configured login gets in.

    Flower serves /metrics and /healthcheck without authentication by design (task and worker
    names and counts, no task arguments); the network restrictions cover those.
    """
    for path in ("/", "/tasks", "/workers", "/api/tasks", "/api/workers"):
        assert httpx.get(url + path, timeout=10).status_code == 401, path
    wrong = base64.b64encode(b"ops:wrong").decode()
    assert (
        httpx.get(url, headers={"Authorization": f"Basic {wrong}"}, timeout=10).status_code == 401
    )
    good = base64.b64encode(user_password.encode()).decode()
    assert httpx.get(url, headers={"Authorization": f"Basic {good}"}, timeout=10).status_code == 200
