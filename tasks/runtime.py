"""The per-process worker runtime: the loaded backend, the slot registry and the heartbeat."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

import redis

from inference import Backend, create_backend
from omnicore.settings import Settings, get_settings
from streaming.keys import Keys, worker_queue
from streaming.slots import WorkerRegistry

log = logging.getLogger("omniserve.worker")


def backend_options(s: Settings) -> dict[str, Any]:
    """Constructor options for the configured backend, from the settings."""
    if s.backend == "scripted":
        opts: dict[str, Any] = {
            "reply": s.scripted_reply,
            "token_delay_s": s.scripted_token_delay_s,
            "step_delay_s": s.scripted_step_delay_s,
            "tokens_per_step": s.scripted_tokens_per_step,
        }
    elif s.backend == "minicpmo":
        opts = {"model_path": s.model_path, "device": s.device}
    elif s.backend == "llama_omni":
        opts = {"backend_url": s.backend_url}
    else:
        opts = {}
    opts.update(s.backend_options)
    return opts


class WorkerRuntime:
    """Everything one worker process holds: backend, Redis client, slots and sessions."""

    def __init__(self, node_name: str, slots: int, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.node_name = node_name
        self.worker_id = f"{node_name}#{os.getpid()}"
        self.queue = worker_queue(self.worker_id)
        self.keys = Keys(self.settings.key_prefix)
        # Every session thread may hold a connection in XREAD BLOCK: size the pool for all of
        # them, and give the heartbeat its own client so a busy pool can never starve it.
        pool = redis.BlockingConnectionPool.from_url(
            self.settings.redis_url,
            max_connections=slots + 8,
            timeout=20,
            health_check_interval=30,
        )
        self.redis = redis.Redis(connection_pool=pool)
        self.beat_redis = redis.Redis.from_url(self.settings.redis_url, health_check_interval=30)
        self.registry = WorkerRegistry(
            self.beat_redis, self.keys, self.worker_id, self.settings.lease_ttl_s
        )
        self.slot_ids = self.registry.slot_ids(slots)
        self.active: dict[str, str] = {}  # slot -> session id
        self.lock = threading.Lock()
        self.shutting_down = threading.Event()
        self.backend: Backend | None = None
        self._beat: threading.Thread | None = None
        self.stopped = False
        self.started_at = time.time()

    # ------------------------------------------------------------------ lifecycle
    def load_backend(self) -> Backend:
        """Create the configured backend (once)."""
        if self.backend is None:
            s = self.settings
            t0 = time.perf_counter()
            log.info("loading backend %r in pid %d", s.backend, os.getpid())
            self.backend = create_backend(s.backend, **backend_options(s))
            log.info(
                "backend %r ready in %.1fs: %s",
                s.backend,
                time.perf_counter() - t0,
                self.backend.info(),
            )
        return self.backend

    def start(self) -> None:
        """Register in Redis, offer the slots and start the heartbeat thread."""
        assert self.backend is not None, "load_backend() first"
        self.registry.register(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "node": self.node_name,
                "queue": self.queue,
                "slots": len(self.slot_ids),
                "backend": self.backend.info(),
            }
        )
        self.registry.heartbeat(self.slot_ids, {})
        self._beat = threading.Thread(target=self._heartbeat, name="omni-heartbeat", daemon=True)
        self._beat.start()
        log.info(
            "worker %s serving %d slot(s) on queue %s",
            self.worker_id,
            len(self.slot_ids),
            self.queue,
        )

    def stop(self) -> None:
        """Leave the registry (the sessions end with server_shutdown)."""
        self.shutting_down.set()
        self.stopped = True
        try:
            self.registry.unregister(self.slot_ids)
        except redis.RedisError:
            log.warning("could not unregister %s", self.worker_id, exc_info=True)

    def _heartbeat(self) -> None:
        interval = self.settings.heartbeat_interval_s
        drain_key = f"{self.keys.prefix}:drain:{self.node_name}"
        while not self.stopped:
            try:
                if not self.shutting_down.is_set() and self.beat_redis.exists(drain_key):
                    log.info("worker %s draining: ending sessions", self.worker_id)
                    self.shutting_down.set()
                with self.lock:
                    active = dict(self.active)
                idle = [s for s in self.slot_ids if s not in active]
                if self.shutting_down.is_set():
                    self.registry.withdraw(idle)
                    self.registry.heartbeat([], active)
                else:
                    self.registry.heartbeat(idle, active)
            except redis.RedisError:
                log.warning("heartbeat failed", exc_info=True)
            time.sleep(interval)
            if self.stopped:
                return  # type: ignore[unreachable]  # stop() sets it from another thread

    # ------------------------------------------------------------------ sessions
    def claim(self, session_id: str) -> bool:
        """Take a session exactly once; a re-delivered or stale task gets False."""
        return bool(
            self.redis.set(
                self.keys.session_claim(session_id),
                self.worker_id,
                nx=True,
                ex=int(self.settings.session_ttl_s),
            )
        )

    def begin(self, slot_id: str, session_id: str) -> None:
        """A session starts on a slot."""
        with self.lock:
            self.active[slot_id] = session_id
        self.registry.hold(slot_id, session_id)

    def end(self, slot_id: str, session_id: str, held_s: float) -> None:
        """A session ended: free its slot and its keys."""
        with self.lock:
            self.active.pop(slot_id, None)
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.delete(self.keys.session_lease(session_id))
                pipe.delete(self.keys.input_audio(session_id), self.keys.input_control(session_id))
                pipe.execute()
            if self.shutting_down.is_set():
                self.registry.withdraw([slot_id])  # draining: take no new work
            else:
                self.registry.release(slot_id)
            self.registry.record_hold(held_s)
        except redis.RedisError:
            log.exception("could not release slot %s", slot_id)

    def gateway_alive(self, gateway_id: str) -> bool:
        """Whether the gateway relaying a session still holds its lease."""
        return bool(self.redis.exists(self.keys.gateway_alive(gateway_id)))

    def owns_slot(self, slot_id: str) -> bool:
        """Whether a slot id belongs to this process."""
        return slot_id in self.slot_ids


_runtime: WorkerRuntime | None = None


def set_runtime(rt: WorkerRuntime | None) -> None:
    """Install the process-wide runtime (done by the worker bootstrap)."""
    global _runtime
    _runtime = rt


def get_runtime() -> WorkerRuntime:
    """The process-wide runtime; raises if this process is not a bootstrapped worker."""
    if _runtime is None:
        raise RuntimeError("worker runtime not initialised in this process")
    return _runtime
