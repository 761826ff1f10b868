"""In the Celery parent of a prefork worker: a pool process that dies is dealt with at once.

Celery replaces a dead pool process by itself, and the new one loads the backend again (the
parent waits ``model_load_timeout_s`` for it: ``worker_proc_alive_timeout``). What Celery does
not do is tell anyone: the dead process's slots would stay registered and its clients would
wait for its leases to lapse. This thread watches the pool's process ids; when one dies it
finishes the output of every session that process was running (``error`` + ``session.closed
backend_error``, or ``inference_error`` for a chat turn) — except a duplex session that fails
over, whose lease it only drops so that its gateway restarts it on another worker at once —,
takes its slots out of the pool and its entry out of the registry. The replacement registers as
loading and offers slots when ready.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from omnicore.settings import Settings
from streaming.codec import loads
from streaming.keys import Keys, slot_worker
from streaming.outage import REDIS_ERRORS
from streaming.redis_url import sync_client
from streaming.slots import forget_worker
from streaming.takeover import finish_output
from tasks.endings import DUPLEX, KIND_OF_TASK, final_events
from tasks.metrics import killed_field, persist

log = logging.getLogger("omniserve.worker")

POLL_S = 0.2


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that its parent has not reaped yet counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class PoolSupervisor:
    """Watches the pool processes of one Celery node from its parent process."""

    def __init__(self, node: str, pool: Any, settings: Settings) -> None:
        self.node = node
        self.pool = pool  # celery.concurrency.prefork.TaskPool
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.redis = sync_client(settings.redis_url, socket_timeout=5, socket_connect_timeout=2)
        self.known: set[int] = set()
        self.pending: set[int] = set()  # died; cleanup not done yet (Redis away)
        self.tasks: dict[str, tuple[str, str]] = {}  # slot id -> (kind, session/turn id)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="omni-pool-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def track(self, request: Any) -> None:
        """A task message reached this node: remember which session runs on which slot."""
        kind = KIND_OF_TASK.get(getattr(request, "name", ""))
        kwargs = getattr(request, "kwargs", None) or {}
        slot = kwargs.get("slot_id")
        sid = kwargs.get("session_id") or kwargs.get("turn_id")
        if kind and slot and sid:
            with self.lock:
                self.tasks[slot] = (kind, sid)

    def pids(self) -> set[int]:
        """The pool's current process ids (read from Celery's own pool object)."""
        try:
            return {p.pid for p in list(self.pool._pool._pool) if p.pid}
        except (AttributeError, TypeError):
            return set()

    def started(self) -> list[int]:
        """Process ids the pool started since the last call (``tasks/prefork.py`` records them):
        one that was started and died between two looks is handled too."""
        record = getattr(getattr(self.pool, "_pool", None), "started", None)
        out: list[int] = []
        while record:
            try:
                out.append(record.popleft())
            except IndexError:
                break
        return out

    def _run(self) -> None:
        while not self.stopped.wait(POLL_S):
            try:
                self.check()
            except Exception:  # this thread must outlive any error
                log.exception("pool supervisor check failed")

    def check(self) -> list[int]:
        """Handle every pool process that died since the last check; returns their pids."""
        born = [p for p in self.started() if p not in self.known]
        current = self.pids()
        for pid in list(self.known) + born:
            if pid not in current or not process_alive(pid):
                self.known.discard(pid)
                self.pending.add(pid)
        self.known |= {p for p in current if process_alive(p)}
        handled = []
        for pid in list(self.pending):
            try:
                self.process_died(pid)
            except REDIS_ERRORS as exc:
                log.warning("pool process %d died; cleanup waits for Redis (%s)", pid, exc)
                continue
            self.pending.discard(pid)
            handled.append(pid)
        return handled

    def process_died(self, pid: int) -> None:
        """End the dead process's sessions for their clients and withdraw its slots."""
        worker_id = f"{self.node}#{pid}"
        k = self.keys
        raw = self.redis.hget(k.workers, worker_id)
        nslots = 1
        if raw:
            nslots = int(loads(raw).get("slots", 1))
        slot_ids = [f"{worker_id}|{i}" for i in range(nslots)]
        with self.lock:
            running = {
                s: self.tasks.pop(s) for s in list(self.tasks) if slot_worker(s) == worker_id
            }
        told, moved = [], []
        for kind, sid in running.values():
            owner = self.redis.get(k.session_lease(sid))
            if not isinstance(owner, bytes) or slot_worker(owner.decode()) != worker_id:
                continue  # it had ended (or the watchdog already told its client)
            if kind == DUPLEX and self._fails_over(sid):
                self.redis.delete(k.session_lease(sid))  # its gateway restarts it elsewhere
                moved.append(sid)
                continue
            finish_output(
                self.redis,
                k,
                sid,
                final_events(kind, "the worker process running this session died"),
                self.settings.output_log_maxlen,
            )
            self.redis.delete(k.session_lease(sid))
            # the replacement process serves this node's counters from Redis (tasks/metrics.py)
            persist(self.redis, k.node_counters(self.node), killed_field(kind))
            told.append(sid)
        forget_worker(self.redis, k, worker_id, slot_ids)
        log.error(
            "pool process %d died (%s); %s; its %d slot(s) left the pool; "
            "a new process loads the backend and offers them when ready",
            pid,
            worker_id,
            f"clients told: {', '.join(told)}"
            if told
            else "it ran no session"
            if not moved
            else "no client told",
            nslots,
        )
        if moved:
            log.error("sessions of pool process %d left to failover: %s", pid, ", ".join(moved))

    def _fails_over(self, session_id: str) -> bool:
        """Whether a duplex session's gateway will restart it on another worker (failover on,
        the session prepared and not ended): then its output is not finished here."""
        if self.settings.failover_wait_s <= 0:
            return False
        key = self.keys.session_resume(session_id)
        init, ended = self.redis.hmget(key, ["init", "ended"])
        return bool(init) and not ended
