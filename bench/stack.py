"""Start and stop the real stack on loopback: a private Redis, gateways, workers, helper processes.

Every process the benchmarks start is registered here and killed on exit, on error and on Ctrl-C
(``atexit`` plus SIGINT/SIGTERM handlers), so a benchmark never leaves anything running.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from bench import pinning
from omnicore.open_files import raise_open_files_limit
from omniserve.redis_server import EmbeddedRedis, free_port, start_embedded
from streaming.keys import Keys
from streaming.redis_url import sync_client

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = Path(os.environ.get("OMNISERVE_BENCH_LOGS", "/tmp/omniserve-bench-logs"))
_CHILDREN: list[subprocess.Popen[bytes]] = []
_REDIS: list[EmbeddedRedis] = []


def kill_all() -> None:
    """Kill every process the benchmarks started (idempotent)."""
    for p in reversed(_CHILDREN):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + 8
    for p in reversed(_CHILDREN):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait(timeout=5)
    _CHILDREN.clear()
    for r in _REDIS:
        r.stop()
    _REDIS.clear()


def _on_signal(signum: int, _frame: object) -> None:
    print(f"\nbench: signal {signum}, stopping every process it started", file=sys.stderr)
    kill_all()
    sys.stderr.flush()
    os._exit(128 + signum)  # exit now, even from inside a running event loop


def install_cleanup() -> None:
    """Kill children at exit and on SIGINT/SIGTERM; raise the file-descriptor limit."""
    atexit.register(kill_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    raise_open_files_limit()  # thousands of client sockets (the gateway raises its own too)


def spawn(
    name: str,
    argv: list[str],
    env: dict[str, str],
    server: bool = False,
    cwd: Path = ROOT,
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start a child in its own process group, logging to LOG_DIR; it is killed at exit.

    ``server``: the process under test (gateway or baseline), placed on the server core when the
    run is pinned (bench.pinning). ``cwd``: the source tree it runs (``python -m`` puts the
    working directory first on ``sys.path``, ahead of any ``PYTHONPATH``)."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{name}.log"
    with open(log, "wb") as fh:  # the child keeps its own copy of the descriptor
        p = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=pinning.server_preexec() if server else None,
        )
    _CHILDREN.append(p)
    return p, log


def stop(p: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Terminate one child (SIGTERM, then SIGKILL)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)
        except ProcessLookupError:
            pass
    if p in _CHILDREN:
        _CHILDREN.remove(p)


def tail(log: Path, n: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def shared_redis() -> str:
    """One private redis-server for the whole run (127.0.0.1 only)."""
    if not _REDIS:
        _REDIS.append(start_embedded())
    return _REDIS[0].url


def service_env(redis_url: str, prefix: str, **settings: str) -> dict[str, str]:
    """The environment of a gateway or worker the benchmarks start: this one without any
    OMNISERVE_ or REDIS_URL setting of the caller's, then the run's Redis, key prefix and
    ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNISERVE_")}
    env.pop("REDIS_URL", None)
    env.update(
        {
            "OMNISERVE_REDIS_URL": redis_url,
            "OMNISERVE_KEY_PREFIX": prefix,
            "OMNISERVE_LOG_LEVEL": "warning",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT),
            **settings,
        }
    )
    return env


@dataclass
class Stack:
    """One omniserve deployment (own key prefix) on the shared private Redis."""

    redis_url: str
    env: dict[str, str] = field(default_factory=dict)
    broker_url: str | None = None  # Celery's broker when it is not ``redis_url`` (a cluster's)
    prefix: str = field(default_factory=lambda: "b" + uuid.uuid4().hex[:6])
    gateway: subprocess.Popen[bytes] | None = None
    port: int = 0
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    slots: int = 0
    deflate: bool = False  # the gateway negotiates permessage-deflate (OMNISERVE_WS_DEFLATE)
    gateway_idle_rss_mib: float = 0.0  # measured when the gateway came up
    python: str = sys.executable  # the gateway's interpreter (bench.ab may try another)
    root: Path = ROOT  # the source tree its gateway and workers run (bench.ab: a revision's)

    @property
    def keys(self) -> Keys:
        """This deployment's Redis names (``streaming/keys.py``)."""
        return Keys(self.prefix)

    def base_env(self) -> dict[str, str]:
        env = service_env(
            self.redis_url,
            self.prefix,
            OMNISERVE_GATEWAY_HOST="127.0.0.1",
            OMNISERVE_WS_DEFLATE="true" if self.deflate else "false",
        )
        env["PYTHONPATH"] = str(self.root)
        if self.broker_url:
            env["OMNISERVE_BROKER_URL"] = self.broker_url
        env.update(self.env)
        return env

    def start_gateway(self) -> int:
        """Start the gateway; returns its port once /health answers."""
        self.port = free_port()
        cmd = ["omniserve", "gateway"]
        self.gateway, log = spawn(
            f"{self.prefix}-gateway",
            [self.python, "-m", *cmd, "--host", "127.0.0.1", "--port", str(self.port)],
            self.base_env(),
            server=True,
            cwd=self.root,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.gateway.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{tail(log)}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    import psutil

                    # before any session: what "idle" means for per-session memory
                    self.gateway_idle_rss_mib = (
                        psutil.Process(self.gateway.pid).memory_info().rss / 2**20
                    )
                    return self.port
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway did not start:\n{tail(log)}")

    def start_worker(
        self, slots: int, options: str = '{"trigger": "always"}', backend: str = "scripted"
    ) -> None:
        """Start a worker (scripted unless ``backend`` says) with ``slots`` concurrent sessions;
        waits for its slots."""
        p, log = spawn(
            f"{self.prefix}-worker{len(self.workers)}",
            [
                sys.executable,
                "-m",
                "omniserve",
                "worker",
                "--backend",
                backend,
                "--slots",
                str(slots),
                "--backend-options",
                options,
            ],
            self.base_env(),
            cwd=self.root,
        )
        self.workers.append(p)
        self.slots += slots
        r = self.redis()
        deadline = time.monotonic() + (60 if backend == "scripted" else 300)  # models load
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"worker exited:\n{tail(log)}")
            if r.llen(self.keys.free_slots) >= self.slots:
                return
            time.sleep(0.1)
        raise RuntimeError(f"worker slots not ready:\n{tail(log)}")

    def start_workers(self, total: int, per_worker: int = 80) -> None:
        """``total`` slots over several worker processes of at most ``per_worker`` slots each
        (one worker's sync Redis pool fails beyond ~100 concurrent sessions; see BENCHMARKS)."""
        while total > 0:
            self.start_worker(min(per_worker, total))
            total -= per_worker

    def redis(self) -> redis.Redis:
        return sync_client(self.redis_url)  # (on a cluster, redis-py's cluster client)

    def free_slots(self) -> int:
        return int(self.redis().llen(self.keys.free_slots))

    def wait_free(self, n: int, timeout: float = 20.0) -> bool:
        """Wait until ``n`` slots are idle again."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.free_slots() >= n:
                return True
            time.sleep(0.1)
        return False

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop this deployment's processes and delete its keys."""
        if self.gateway is not None:
            stop(self.gateway)
        for w in self.workers:
            stop(w)
        try:
            r = self.redis()
            keys = list(r.scan_iter(f"{self.prefix}:*", count=1000))
            for i in range(0, len(keys), 1000):
                r.delete(*keys[i : i + 1000])  # (a cluster client deletes them slot by slot)
        except (redis.RedisError, redis.exceptions.RedisClusterException):
            pass


def redis_pid() -> int:
    """Pid of the private redis-server."""
    return _REDIS[0].process.pid


def start_baseline(deflate: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    """Start the bare in-process baseline server (bench/baseline.py); returns it and its port.

    It negotiates permessage-deflate exactly when the gateway under test does.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNISERVE_")}
    env["PYTHONPATH"] = str(ROOT)
    p, log = spawn(
        f"baseline-{port}",
        [sys.executable, "-m", "bench.baseline", str(port), "deflate" if deflate else "plain"],
        env,
        server=True,
    )
    import socket

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"baseline exited:\n{tail(log)}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return p, port
        time.sleep(0.05)
    raise RuntimeError(f"baseline did not start:\n{tail(log)}")
