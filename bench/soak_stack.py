"""The soak's deployment (``python -m bench soak``): its processes, the faults it takes, and the
slot pool as Redis holds it.

Redis runs on a fixed port so that it can be killed and started again empty there; gateway 0 is
never killed (its memory is the run's leak check), gateway 1 is; worker 0 is a threads pool with
two slots, worker 1 a prefork pool with one (a pool process to kill).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import psutil
import redis

from bench.stack import kill_all, service_env, spawn, stop, tail
from omniserve.redis_server import EmbeddedRedis, free_port, start_embedded
from streaming.keys import Keys

OMNISERVE = [sys.executable, "-m", "omniserve"]


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class SoakStack:
    """Redis (restartable on its port), gateway 0 (never killed), gateway 1, two workers."""

    redis_port: int = field(default_factory=free_port)
    prefix: str = field(default_factory=lambda: "soak" + uuid.uuid4().hex[:6])
    redis_server: EmbeddedRedis | None = None
    gateway_ports: list[int] = field(default_factory=lambda: [free_port(), free_port()])
    gateways: list[subprocess.Popen[bytes] | None] = field(default_factory=lambda: [None, None])
    workers: list[subprocess.Popen[bytes] | None] = field(default_factory=lambda: [None, None])
    gateway_epoch: list[int] = field(default_factory=lambda: [0, 0])  # bumped by each kill
    WORKER_SLOTS = (2, 1)  # worker 0: threads pool; worker 1: prefork (a pool process to kill)

    @property
    def keys(self) -> Keys:
        """This deployment's Redis names (``streaming/keys.py``)."""
        return Keys(self.prefix)

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def total_slots(self) -> int:
        return sum(self.WORKER_SLOTS)

    def env(self) -> dict[str, str]:
        return service_env(
            self.redis_url,
            self.prefix,
            OMNISERVE_GATEWAY_LEASE_TTL_S="3",
            OMNISERVE_SCRIPTED_TOKEN_DELAY_S="0.02",
        )

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_timeout=5)

    def start(self) -> None:
        self.redis_server = start_embedded(self.redis_port)
        for i in range(2):
            self.start_worker(i)
        for i in range(2):
            self.start_gateway(i)
        self.wait_pool_full(90)

    def start_gateway(self, i: int) -> None:
        port = self.gateway_ports[i]
        p, log = spawn(
            f"{self.prefix}-gateway{i}",
            [*OMNISERVE, "gateway", "--host", "127.0.0.1", "--port", str(port)],
            self.env(),
        )
        self.gateways[i] = p
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{tail(log)}")
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"gateway did not start:\n{tail(log)}")

    def start_worker(self, i: int) -> None:
        p, _ = spawn(
            f"{self.prefix}-worker{i}-{int(time.time())}",
            [*OMNISERVE, "worker", "--backend", "scripted", "--slots", str(self.WORKER_SLOTS[i])],
            self.env(),
        )
        self.workers[i] = p

    def url(self, i: int) -> str:
        return f"ws://127.0.0.1:{self.gateway_ports[i]}"

    def gateway_rss_mib(self) -> float:
        p = self.gateways[0]
        assert p is not None
        return float(psutil.Process(p.pid).memory_info().rss / 2**20)

    # ------------------------------------------------------------------ faults
    def kill_worker(self, rng: random.Random) -> str:
        i = rng.randrange(2)
        p = self.workers[i]
        assert p is not None
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        stop(p)  # forget it
        time.sleep(rng.uniform(0.5, 3.0))
        self.start_worker(i)
        return f"worker {i}"

    def kill_pool_process(self, rng: random.Random) -> str:
        p = self.workers[1]
        assert p is not None
        children = psutil.Process(p.pid).children()
        if not children:
            return "worker 1 has no pool process now"
        children[0].kill()
        return f"pool process {children[0].pid}"

    def kill_gateway(self, rng: random.Random) -> str:
        p = self.gateways[1]
        assert p is not None
        self.gateway_epoch[1] += 1
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        stop(p)
        time.sleep(rng.uniform(0.5, 2.0))
        self.start_gateway(1)
        return "gateway 1"

    def restart_redis(self, rng: random.Random) -> str:
        assert self.redis_server is not None
        self.redis_server.process.kill()
        self.redis_server.process.wait(timeout=10)
        self.redis_server.stop()
        time.sleep(rng.uniform(0.5, 3.0))
        self.redis_server = start_embedded(self.redis_port)
        return "redis (started again empty)"

    def fault_client(self, rng: random.Random, no_read: bool) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "bench.fault_client", self.url(rng.randrange(2))]
        name = f"{self.prefix}-client-{uuid.uuid4().hex[:4]}"
        p, _ = spawn(name, args + (["--no-read"] if no_read else []), self.env())
        return p

    # ------------------------------------------------------------------ state
    def free_slots(self) -> int:
        return int(self.redis().llen(self.keys.free_slots))

    def queue_length(self) -> int:
        return int(self.redis().zcard(self.keys.queue))

    def pool(self) -> dict[str, Any]:
        """The slot pool as Redis holds it: live workers' slots, which are free, which busy."""
        r = self.redis()
        keys = self.keys
        live: dict[str, int] = {}
        for raw_id, info in r.hgetall(keys.workers).items():
            wid, entry = str(_text(raw_id)), orjson.loads(info)
            if r.exists(keys.worker_alive(wid)) and entry.get("state") == "ready":
                live[wid] = int(entry.get("slots", 1))
        free = [str(_text(s)) for s in r.lrange(keys.free_slots, 0, -1)]
        busy = sorted(str(_text(s)) for s in r.smembers(keys.busy_slots))
        return {
            "live_slots": sum(live.values()),
            "free_live": sum(1 for s in free if s.rsplit("|", 1)[0] in live),
            "free_other": [s for s in free if s.rsplit("|", 1)[0] not in live],
            "busy": busy,
            # which session holds each busy slot (its hold key): the one to look up in the logs
            "held_by": {b: _text(r.get(keys.slot_hold(b))) for b in busy},
        }

    def wait_pool_full(self, timeout: float) -> bool:
        """Every live worker's every slot free, the queue empty (and both workers serving)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pool = self.pool()
                if (
                    pool["live_slots"] == self.total_slots
                    and pool["free_live"] == self.total_slots
                    and self.queue_length() == 0
                ):
                    return True
            except redis.RedisError:
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        kill_all()
        if self.redis_server is not None:
            self.redis_server.stop()
