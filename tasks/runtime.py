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
from inference.registry import choose_backend, loading_what
from omnicore.settings import Settings, get_settings
from streaming import lua
from streaming.keys import Keys, worker_queue
from streaming.outage import REDIS_ERRORS, is_outage
from streaming.output_writer import OutputWriter
from streaming.redis_connection import worker_client
from streaming.session_claim import Claimed, SessionClaimer
from streaming.slots import WorkerRegistry, expected_load_s, forget_worker, record_load_time
from streaming.stalls import STALL_S, StallWatch
from tasks.metrics import WorkerMetrics
from tasks.watchdog import COUNTER as STEP_TIMEOUTS
from tasks.watchdog import StepWatchdog

GATEWAY_SEEN_S = 0.5  # a gateway's lease found held is not asked about again this long

log = logging.getLogger("omniserve.worker")
BEAT_FAILING_LOG_S = 5.0  # a heartbeat that keeps failing says so again this often


def backend_options(s: Settings, name: str | None = None) -> dict[str, Any]:
    """Constructor options for the configured backend: the typed settings each backend reads,
    then ``backend_options`` (free-form, per backend) over them, so an operator can pass an
    option the settings do not name without a new setting."""
    name = name or s.backend
    if name == "scripted":
        opts: dict[str, Any] = {
            "reply": s.scripted_reply,
            "token_delay_s": s.scripted_token_delay_s,
            "step_delay_s": s.scripted_step_delay_s,
            "tokens_per_step": s.scripted_tokens_per_step,
        }
    elif name == "minicpmo":
        opts = {"model_path": s.model_path, "device": s.device}
    elif name == "llama_omni":
        opts = {"backend_url": s.backend_url}
    else:
        opts = {}
    opts.update(s.backend_options)
    return opts


class WorkerRuntime:
    """Everything one worker process holds: backend, Redis client, slots and sessions.

    Lifecycle: ``announce`` (registered as loading: coming capacity, heartbeat running),
    ``load_backend``, ``start`` (ready: slots offered), ``stop``. The heartbeat thread survives
    every error and rewrites what this process owns in Redis on every beat.
    """

    def __init__(self, node_name: str, slots: int, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.node_name = node_name
        self.worker_id = f"{node_name}#{os.getpid()}"
        self.queue = worker_queue(self.worker_id)
        self.keys = Keys(self.settings.key_prefix)
        self.backend_name, self.backend_note = choose_backend(self.settings.backend)
        # Every session thread may hold a connection in XREAD BLOCK: the pool has one for each
        # slot and a few to spare for the rest of the process. The heartbeat has a client of its
        # own, so a busy pool never delays the beat that keeps the leases alive.
        self.redis = worker_client(self.settings.redis_url, slots + 8)
        self.beat_redis = worker_client(self.settings.redis_url, None)
        self.registry = WorkerRegistry(
            self.beat_redis, self.keys, self.worker_id, self.settings.lease_ttl_s
        )
        self.slot_ids = self.registry.slot_ids(slots)
        self.claimer = SessionClaimer(
            self.redis,
            self.keys,
            self.worker_id,
            claim_ttl_s=self.settings.session_ttl_s,
            lease_ttl_s=self.settings.lease_ttl_s,
        )
        self.active: dict[str, str] = {}  # slot -> session id
        self.quarantined: set[str] = set()  # slots whose backend step hung: never offered
        # slots whose session's lease another slot holds now (``WorkerRegistry.heartbeat``):
        # the session ends here silently and leaves its keys to that slot
        self.taken: set[str] = set()
        self._end_lease = self.redis.register_script(lua.END_LEASE)
        self.writers: dict[str, OutputWriter] = {}  # slot -> the event writer its sessions share
        self.lock = threading.Lock()
        self.shutting_down = threading.Event()  # draining: no new work (see must_close)
        self.drain_deadline = 0.0  # unix time by which running sessions must end
        self.ready = threading.Event()
        self.backend: Backend | None = None
        self.watchdog = StepWatchdog(self, self.settings.step_timeout_s)
        self.restart_on_hang = False  # prefork: a hung step restarts the process (set by bootstrap)
        self.counters: dict[str, int] = {"backend_step_timeouts_total": 0}
        self.metrics = WorkerMetrics(self, self.backend_name)
        self._beat: threading.Thread | None = None
        self._beat_failing_since: float | None = None
        self._beat_failing_logged = 0.0  # monotonic: when a failing beat was last logged
        # the heartbeat's round trips, timed: a gateway lease read gone just after Redis itself
        # stalled does not end its sessions (``gateway_alive``)
        self.stalls = StallWatch(self.settings.heartbeat_interval_s, self.settings.lease_ttl_s)
        # gateway id -> monotonic time until which its lease counts as held without asking
        self._gateways_seen: dict[str, float] = {}
        self.beats = 0
        self.stopped = False
        self.process_stopping = False  # Celery's warm shutdown began (not only a drain flag)
        self.started_at = time.time()

    # ------------------------------------------------------------------ lifecycle
    def announce(self) -> None:
        """Register as loading (clients may queue for this capacity) and start the heartbeat."""
        expected = None
        try:
            expected = expected_load_s(self.beat_redis, self.keys, self.backend_name)
        except REDIS_ERRORS:
            pass
        info: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "node": self.node_name,
            "queue": self.queue,
            "slots": len(self.slot_ids),
            "state": "loading",
            "loading": loading_what(self.backend_name),
            "loading_since": time.time(),
            "expected_load_s": expected,
            "backend": {"backend": self.backend_name},
        }
        if self.backend_note:
            info["note"] = self.backend_note
            log.warning("%s", self.backend_note)
        self.metrics.keep_in_redis(self.beat_redis, self.keys.node_counters(self.node_name))
        s = self.settings
        self.metrics.serve(s.worker_metrics_host, s.worker_metrics_port)
        try:
            self.registry.register(info)
        except REDIS_ERRORS:
            self.registry.info = {**info, "worker_id": self.worker_id}  # the heartbeat writes it
            log.warning("could not register %s yet; the heartbeat will", self.worker_id)
        self._beat = threading.Thread(target=self._heartbeat, name="omni-heartbeat", daemon=True)
        self._beat.start()

    def load_backend(self) -> Backend:
        """Create the configured backend (once), and record how long it took: the next worker
        announces that figure, so queued clients are told how long its capacity will take."""
        if self.backend is None:
            name = self.backend_name
            t0 = time.perf_counter()
            log.info("loading %s in pid %d", loading_what(name), os.getpid())
            self.backend = create_backend(name, **backend_options(self.settings, name))
            took = time.perf_counter() - t0
            self.metrics.loaded(took)
            log.info("backend %r ready in %.1fs: %s", name, took, self.backend.info())
            try:
                record_load_time(self.beat_redis, self.keys, name, took)
            except REDIS_ERRORS:
                pass
        return self.backend

    def start(self) -> None:
        """The backend is loaded: become ready, offer the slots, start the step watchdog."""
        assert self.backend is not None, "load_backend() first"
        info = {"state": "ready", "ready_at": time.time(), "backend": self.backend.info()}
        for slot_id in self.slot_ids:  # before any session: none pays for starting a thread
            self.writer(slot_id)
        self.ready.set()
        try:
            self.registry.update(**info)
            self.beat_once()
        except REDIS_ERRORS as exc:  # Redis not up yet: the message says it all
            self.registry.info.update(info)
            log.warning("could not offer slots yet (%s); the heartbeat will", exc)
        self.watchdog.start()
        log.info(
            "worker %s serving %d slot(s) on queue %s",
            self.worker_id,
            len(self.slot_ids),
            self.queue,
        )

    def start_drain(self, deadline_ts: float, why: str) -> None:
        """Take no new sessions; running ones may go on until ``deadline_ts`` (unix time)."""
        if self.shutting_down.is_set():
            return
        self.drain_deadline = deadline_ts
        self.shutting_down.set()  # the heartbeat marks the registry entry (signal-safe here)
        left = max(0.0, deadline_ts - time.time())
        log.info(
            "worker %s draining (%s): no new sessions; %d running may go on for %.0f s",
            self.worker_id,
            why,
            len(self.active),
            left,
        )

    def must_close(self) -> bool:
        """Whether running sessions must end now with server_shutdown (drain grace over)."""
        return self.shutting_down.is_set() and time.time() >= self.drain_deadline

    def overdue_s(self) -> float:
        """How long ago the drain's deadline passed (0: not draining, or not yet)."""
        if not self.shutting_down.is_set():
            return 0.0
        return max(0.0, time.time() - self.drain_deadline)

    def only_hung_left(self) -> bool:
        """The process is stopping, and every session it still runs is one whose step hung
        (the watchdog ended those; their threads may never come back)."""
        with self.lock:
            return self.process_stopping and not self.active and bool(self.quarantined)

    def stop(self) -> None:
        """Leave the registry (the sessions end with server_shutdown)."""
        self.drain_deadline = 0.0
        self.shutting_down.set()
        self.stopped = True
        try:
            self.registry.unregister(self.slot_ids)
        except REDIS_ERRORS as exc:
            log.warning("could not unregister %s (%s)", self.worker_id, exc)

    def leave_now(self) -> None:
        """This process is about to exit abnormally: its slots leave the pool at once."""
        self.stopped = True
        try:
            forget_worker(self.beat_redis, self.keys, self.worker_id, self.slot_ids)
        except REDIS_ERRORS as exc:
            log.warning("could not withdraw %s (%s)", self.worker_id, exc)

    # ------------------------------------------------------------------ heartbeat
    def _heartbeat(self) -> None:
        """Beat every ``heartbeat_interval_s`` until stopped. It must never die: the leases it
        renews are what keeps this worker's sessions from being restarted elsewhere, so an error
        is logged once (and again when Redis answers) and the next beat tries again."""
        interval = self.settings.heartbeat_interval_s
        while not self.stopped:
            started = time.monotonic()
            try:
                self.beat_once()
                self.stalls.answered(started)
                if self._beat_failing_since is not None:
                    log.warning(
                        "heartbeat: Redis answers again after %.1f s; %s re-announced",
                        time.monotonic() - self._beat_failing_since,
                        self.worker_id,
                    )
                    self._beat_failing_since = None
            except Exception as exc:  # this thread must outlive any error
                self.stalls.failed()
                if self._beat_failing_since is None:
                    self._beat_failing_since = self._beat_failing_logged = time.monotonic()
                    log.warning("heartbeat failed (%s: %s); retrying", type(exc).__name__, exc)
                elif time.monotonic() - self._beat_failing_logged > BEAT_FAILING_LOG_S:
                    self._beat_failing_logged = time.monotonic()
                    log.warning(
                        "heartbeat still fails (%s: %s)", type(exc).__name__, exc, exc_info=True
                    )
                else:
                    log.debug("heartbeat failed again", exc_info=True)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))

    def beat_once(self) -> None:
        """Renew everything this process owns in Redis (and notice a drain request)."""
        if not self.shutting_down.is_set():
            try:
                deadline = self.beat_redis.get(self.keys.drain(self.node_name))
            except REDIS_ERRORS as exc:
                if not is_outage(exc):
                    raise
                deadline = None  # (its shard away: the leases on the others are renewed first)
            if deadline is not None:
                self.start_drain(float(deadline), "drain flag in Redis")
        with self.lock:
            active = dict(self.active)
            blocked = set(active) | self.quarantined
        idle = [s for s in self.slot_ids if s not in blocked]
        if self.shutting_down.is_set():
            if self.registry.info.get("state") != "draining" and self.ready.is_set():
                # gateways stop counting this worker as capacity (streaming/admission.py)
                self.registry.update(state="draining", draining_until=self.drain_deadline)
            self.registry.withdraw(idle)
            rewritten, taken = self.registry.heartbeat([], active)
        else:
            rewritten, taken = self.registry.heartbeat(idle if self.ready.is_set() else [], active)
        with self.lock:  # (a session that ended during the beat leaves no mark on its slot)
            fresh = {s for s in taken if s not in self.taken and self.active.get(s) == active[s]}
            self.taken |= fresh
        for slot in fresh:
            log.warning(
                "session %s runs on another slot now (this process was taken for lost): "
                "ending it on %s without a word to its client",
                active[slot],
                slot,
            )
        self.beats += 1
        if rewritten and self.beats > 1:
            log.warning(
                "registry entry of %s was gone (Redis restarted empty, or was out of reach past "
                "its TTL): registered again, %d idle slot(s) offered, %d session lease(s) renewed",
                self.worker_id,
                len(idle) if self.ready.is_set() else 0,
                len(active),
            )

    # ------------------------------------------------------------------ sessions
    def claim(
        self, claim_id: str, slot_id: str, session_id: str, chat_turn: bool = False
    ) -> Claimed | None:
        """Take a session exactly once, with its slot hold and lease (and a chat turn's request)
        in the same step; a re-delivered or stale task gets None and changes nothing."""
        return self.claimer.claim(claim_id, slot_id, session_id, chat_turn)

    def writer(self, slot_id: str) -> OutputWriter:
        """The slot's event writer, started once and handed from session to session
        (streaming/output_writer.py says why)."""
        with self.lock:
            writer = self.writers.get(slot_id)
            if writer is None:
                writer = self.writers[slot_id] = OutputWriter(f"out-{slot_id}")
        writer.start()
        return writer

    def begin(self, slot_id: str, session_id: str) -> None:
        """A claimed session starts on a slot: the heartbeat renews its hold and lease now."""
        with self.lock:
            self.active[slot_id] = session_id

    def was_taken(self, slot_id: str) -> bool:
        """Whether the slot's session runs on another slot now (it must end here, silently)."""
        return slot_id in self.taken

    def end(self, slot_id: str, session_id: str, held_s: float) -> None:
        """A session ended: free its slot, and drop its lease and input streams.

        The keys go only while this slot still holds the lease (``END_LEASE``): a session that
        was taken over runs on another slot now, and those keys are that attempt's."""
        with self.lock:
            self.active.pop(slot_id, None)
            # a hung step came back: the backend answers again, so the slot may serve again
            self.quarantined.discard(slot_id)
            self.taken.discard(slot_id)
        lease_and_input = [
            self.keys.session_lease(session_id),
            self.keys.input_audio(session_id),
            self.keys.input_control(session_id),
        ]
        try:
            self._end_lease(keys=lease_and_input, args=[slot_id])
        except REDIS_ERRORS as exc:
            if not is_outage(exc):
                log.exception("could not drop the lease of %s", session_id)
            else:  # (its shard away: a lease no one renews lapses, the streams expire)
                log.warning("could not drop the lease of %s (%s)", session_id, exc)
        try:
            if self.shutting_down.is_set():
                self.registry.withdraw([slot_id])  # draining: take no new work
            else:
                self.registry.release(slot_id, held_s)  # (its hold time in the same step)
        except REDIS_ERRORS:
            log.exception("could not release slot %s", slot_id)

    def quarantine(self, slot_id: str, session_id: str) -> None:
        """A session's step hung: stop renewing its lease and never offer its slot meanwhile."""
        with self.lock:
            if self.active.get(slot_id) == session_id:
                self.active.pop(slot_id)
            self.quarantined.add(slot_id)
        try:
            lease = [self.keys.session_lease(session_id)]  # (unless another slot holds it now)
            self._end_lease(keys=lease, args=[slot_id], client=self.beat_redis)
        except REDIS_ERRORS as exc:
            log.warning("could not drop the lease of %s (%s)", session_id, exc)

    def count(self, name: str) -> None:
        """Add one to a worker counter, here and in Redis: the count must outlive this process
        (a hung step restarts a prefork one)."""
        self.counters[name] = self.counters.get(name, 0) + 1
        if name == STEP_TIMEOUTS:
            self.metrics.count("omniserve_" + name, self.backend_name)
        try:
            self.beat_redis.hincrby(self.keys.worker_counters, name, 1)
        except REDIS_ERRORS:
            log.warning("could not count %s in Redis", name)

    def gateway_alive(self, gateway_id: str) -> bool:
        """Whether the gateway relaying a session still holds its lease.

        A session ends when its gateway is gone, so a gone lease is believed only when Redis
        answers on time: a read that was slow or timed out, one that found Redis away
        (``streaming/outage.py``), or one just after Redis stalled or came back
        (``streaming/stalls.py``), says nothing about the gateway and reads as held. (A session
        whose Redis stays away ends by its own reads and writes, past their outage grace.)
        A lease found held counts as held for ``GATEWAY_SEEN_S`` for every session of this
        process: a process's sessions mostly share a few gateways, and each asked twice a
        second (``tasks/presence.py``) where one answer serves them all."""
        began = time.monotonic()
        if self._gateways_seen.get(gateway_id, 0.0) > began:
            return True
        try:
            if self.redis.exists(self.keys.gateway_alive(gateway_id)):
                self._gateways_seen[gateway_id] = time.monotonic() + GATEWAY_SEEN_S
                return True
        except redis.TimeoutError:
            return True  # Redis stalls: nothing can be told
        except REDIS_ERRORS as exc:
            if is_outage(exc):  # Redis away (a failover, a restart): nothing can be told either
                return True
            raise
        return time.monotonic() - began > STALL_S or not self.stalls.settled()

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
