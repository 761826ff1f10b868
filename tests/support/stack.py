"""Real processes for end-to-end tests: a private Redis, uvicorn gateways, Celery workers.

Every Stack uses its own key prefix, so stacks sharing the session's Redis never see each other.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from omniserve.children import dies_with_parent
from omniserve.redis_server import free_port
from streaming.keys import Keys
from streaming.redis_url import sync_client

ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = Path(os.environ.get("OMNISERVE_TEST_LOGS", "/tmp/omniserve-test-logs"))


@dataclass
class Proc:
    """A child process with its log file."""

    popen: subprocess.Popen[bytes]
    log: Path
    name: str

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=5)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class Stack:
    """One omniserve deployment on loopback."""

    redis_url: str
    prefix: str = field(default_factory=lambda: "t" + uuid.uuid4().hex[:8])
    env: dict[str, str] = field(default_factory=dict)
    gateways: list[tuple[Proc, int]] = field(default_factory=list)
    gateway_hosts: list[str] = field(default_factory=list)  # the address each gateway binds
    workers: list[Proc] = field(default_factory=list)
    broker_url: str | None = None  # Celery's broker when it is not ``redis_url`` (a cluster's)

    @property
    def keys(self) -> Keys:
        """This deployment's Redis names (``streaming/keys.py``: spelled there only)."""
        return Keys(self.prefix)

    def base_env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNISERVE_")}
        env.pop("REDIS_URL", None)
        env.update(
            {
                "OMNISERVE_REDIS_URL": self.redis_url,
                "OMNISERVE_KEY_PREFIX": self.prefix,
                "OMNISERVE_LOG_LEVEL": "info",
                "OMNISERVE_QUEUE_UPDATE_INTERVAL_S": "1",
                # no worker metrics endpoint unless a test asks for one on a free port: workers
                # of parallel stacks on one machine would otherwise share (or fight for) 9108
                "OMNISERVE_WORKER_METRICS_PORT": "0",
                # SIGTERM ends sessions at once unless a test measures the drain grace
                "OMNISERVE_DRAIN_GRACE_S": "0",
                # a duplex relay loop must be woken by what it waits for, never by its backstop
                "OMNISERVE_RELAY_LOOK_S": "600",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": str(ROOT),
            }
        )
        if self.broker_url:
            env["OMNISERVE_BROKER_URL"] = self.broker_url
        env.update(self.env)
        env.update(overrides)
        return env

    def _spawn(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        nofile: tuple[int, int] | None = None,
        wrap: Sequence[str] = (),
    ) -> Proc:
        """``omniserve ARGS``; ``nofile``: its open-files limit (soft, hard) from the start;
        ``wrap``: a command that execs it (``ip netns exec NS``: on another host)."""
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = LOG_DIR / f"{self.prefix}-{name}.log"
        dies = dies_with_parent(signal.SIGKILL)  # a killed pytest leaves nothing

        def preexec() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
            if dies is not None:
                dies()

        with open(log, "wb") as fh:  # the child keeps its own copy of the descriptor
            popen = subprocess.Popen(
                [*wrap, sys.executable, "-m", "omniserve", *args],
                env=env,
                cwd=ROOT,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        return Proc(popen, log, name)

    # ------------------------------------------------------------------ parts
    def start_gateway(
        self,
        ready_path: str = "/health",
        nofile: tuple[int, int] | None = None,
        host: str = "127.0.0.1",
        wrap: Sequence[str] = (),
        **env: str,
    ) -> int:
        """Start a gateway on a free port; returns the port once ``ready_path`` answers 200
        (``/healthz``: the process serves, whether or not Redis does). ``nofile``: its
        open-files limit (soft, hard); ``host``: the address it binds (and is reached at);
        ``wrap``: a command that execs it (``Host.argv([])`` of ``tests/support/netns.py``)."""
        port = free_port()
        bind = env.pop("OMNISERVE_GATEWAY_HOST", host)
        host = "127.0.0.1" if bind in ("0.0.0.0", "") else bind  # (every address: loopback too)
        proc = self._spawn(
            f"gateway{len(self.gateways)}",
            ["gateway", "--port", str(port)],
            self.base_env(OMNISERVE_GATEWAY_HOST=bind, **env),
            nofile,
            wrap,
        )
        self.gateways.append((proc, port))
        self.gateway_hosts.append(host)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"gateway exited:\n{proc.tail()}")
            try:
                if httpx.get(f"http://{host}:{port}{ready_path}", timeout=1).status_code == 200:
                    return port
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway did not start:\n{proc.tail()}")

    def start_worker(
        self,
        backend: str = "scripted",
        slots: int = 1,
        wait: bool = True,
        wrap: Sequence[str] = (),
        **env: str,
    ) -> Proc:
        """Start a worker node; waits until its slots are registered (a model backend may
        convert its model on a first load, or wait for another process converting it: minutes
        on a busy 2-core machine, not seconds). ``wrap``: as for ``start_gateway``."""
        before = self.live_slots()
        proc = self._spawn(
            f"worker{len(self.workers)}",
            ["worker", "--backend", backend, "--slots", str(slots)],
            self.base_env(**env),
            wrap=wrap,
        )
        self.workers.append(proc)
        if wait:
            self.wait_slots(before + slots, proc, timeout=60 if backend == "scripted" else 300)
        return proc

    def redis(self) -> redis.Redis:
        return sync_client(self.redis_url)  # (a redis+sentinel:// URL too)

    def live_slots(self, state: str = "ready") -> int:
        """Slots of live workers in ``state`` (``ready``: serving; ``loading``: coming)."""
        import orjson

        r = self.redis()
        total = 0
        for wid, info in r.hgetall(self.keys.workers).items():
            entry = orjson.loads(info)
            if entry.get("state", "ready") != state:
                continue
            if r.exists(self.keys.worker_alive(wid.decode())):
                total += int(entry.get("slots", 1))
        return total

    def free_slots(self) -> int:
        return int(self.redis().llen(self.keys.free_slots))

    def wait_slots(self, n: int, proc: Proc | None = None, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and not proc.alive():
                raise RuntimeError(f"worker exited:\n{proc.tail()}")
            if self.live_slots() >= n and self.free_slots() >= n:
                return
            time.sleep(0.1)
        raise RuntimeError(f"worker slots not ready:\n{proc.tail() if proc else ''}")

    def wait_free(self, n: int, timeout: float = 20) -> None:
        """Wait until ``n`` slots are idle in the pool."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.free_slots() >= n:
                return
            time.sleep(0.05)
        raise AssertionError(f"expected {n} free slots, have {self.free_slots()}")

    def url(self, i: int = 0) -> str:
        return f"ws://{self.gateway_hosts[i]}:{self.gateways[i][1]}"

    def stop(self) -> None:
        for proc, _ in self.gateways:
            proc.stop()
        for proc in self.workers:
            proc.stop()
        try:
            r = self.redis()
            keys = list(r.scan_iter(f"{self.prefix}:*", count=1000))
            if keys:
                r.delete(*keys)  # (a cluster client deletes them slot by slot)
        except (redis.RedisError, redis.exceptions.RedisClusterException):
            pass
