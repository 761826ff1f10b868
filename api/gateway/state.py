"""The gateway process state: Redis clients, the shared output bus, the queue, task submission."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Protocol

from celery import Celery
from redis.exceptions import ResponseError

from api.gateway.client_watch import ClientWatch
from api.gateway.liveness import Liveness
from api.gateway.metering import Metering
from api.gateway.queueing import QueueManager
from api.gateway.task_submit import TaskSender
from api.gateway.waiting_events import WaitingEvents
from api.gateway.worker_stops import WorkerStops
from api.metrics.registry import GatewayMetrics
from api.recordings.recorder import Recorder
from omnicore.redact import redact_url
from omnicore.settings import Settings
from streaming import redis_requirements
from streaming.admission import Admission
from streaming.broker_url import broker_target, gateway_transport_options, where
from streaming.input import InputWriter
from streaming.jobs import Job
from streaming.keys import Keys, slot_worker, worker_queue
from streaming.keystore import KeyStore
from streaming.outage import REDIS_OR_OS_ERRORS
from streaming.output import OutputBus
from streaming.redis_connection import gateway_client
from streaming.resume import ResumeStore

log = logging.getLogger("omniserve.gateway")

REQUIREMENTS_EVERY_S = 60.0  # how often Redis's configuration is read again


class LiveSession(Protocol):
    """What the gateway needs of a session handler: a way to end it at shutdown, and what the
    operator page shows of it (``api/ops/pages.py``)."""

    @property
    def public_mode(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def dialect(self) -> str | None: ...
    @property
    def slot_id(self) -> str | None: ...  # the worker slot held now (a chat session: per turn)
    @property
    def slot_since(self) -> float | None: ...  # when that slot was assigned (unix time)
    @property
    def connected_at(self) -> float: ...
    @property
    def deadline(self) -> float: ...

    async def shutdown(self) -> None:
        """End the session with ``server_shutdown``."""


class Gateway:
    """Everything one gateway process shares between its connections."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.gateway_id = uuid.uuid4().hex[:10]
        self.keys = Keys(settings.key_prefix)
        self.redis = gateway_client(settings.redis_url, settings.redis_max_connections)
        # Submits tasks by name: the gateway never imports worker code.
        self.broker = broker_target(settings.broker)
        self.broker_where = where(settings.broker)  # what /health names
        self.celery = Celery("omniserve-gateway", broker=self.broker.kombu_url)
        self.celery.conf.update(
            broker_transport_options=gateway_transport_options(self.broker),
            task_serializer="json",
            broker_connection_retry_on_startup=True,
            # the gateway only publishes and never drives an AMQP heartbeat: with one agreed,
            # RabbitMQ would close its idle connections
            broker_heartbeat=0,
        )
        broker_redis = None
        if settings.separate_broker and self.broker.kind != "amqp":
            broker_redis = gateway_client(settings.broker, 16)
        self.sender = TaskSender(self.redis, self.celery, self.broker, broker_redis)
        # what Flower shows of this gateway's waiting clients
        self.waiting_events = WaitingEvents(self.celery, self.gateway_id)
        self.admission = Admission(self.redis, self.keys)
        self.queue = QueueManager(
            self.admission,
            self.gateway_id,
            settings.max_queue,
            settings.queue_update_interval_s,
            settings.capacity_wait_s,
            self.waiting_events,
        )
        self.resumes = ResumeStore(self.redis, self.keys)
        # the sessions' checks, one read a tick
        self.liveness = Liveness(
            self.redis,
            self.keys,
            settle_s=settings.lease_ttl_s,
            outage_grace_s=settings.redis_outage_grace_s,
        )
        self.bus = OutputBus(
            self.redis,
            self.keys,
            on_queue_event=self.queue.on_event,
            max_events=settings.output_max_pending_events,
            max_bytes=settings.output_max_pending_bytes,
        )
        self.inputs = InputWriter(
            self.redis,
            self.keys,
            settings.input_max_pending,
            settings.session_ttl_s,
            name=f"omniserve-input-{self.gateway_id}",  # its own connection (CLIENT LIST)
            outage_grace_s=settings.redis_outage_grace_s,
        )
        self.recorder = Recorder(settings, self.gateway_id)  # recordings of every session
        self.sessions: dict[str, LiveSession] = {}  # session_id -> live session handler
        self.watch = ClientWatch()  # every connection's dead-client checks, in one task
        # telling workers of ended sessions, until Redis takes it
        self.stops = WorkerStops(self.inputs, self.resumes)
        self.started_at = time.time()
        self.shutting_down = False
        self._live_slots = 0
        self._slots_checked_at = 0.0
        self._lease_task: asyncio.Task[None] | None = None
        # why Redis refuses this gateway's writes now (full, MISCONF, read-only), or None: leases
        # read as held meanwhile (streaming/stalls.py), new clients are refused with it, /health
        # says it
        self.writes_refused: str | None = None
        self.redis_unreachable: str | None = None  # why the last lease renewal failed, if it did
        self._lease_renewed = False  # a renewal went through (a key gone after it was lost)
        self.redis_unmet: list[str] = []  # what Redis lacks (streaming/redis_requirements.py)
        self._requirements_read_at = 0.0  # monotonic; 0: at the next renewal that goes through
        self.metrics = GatewayMetrics()
        # named keys, usage and quotas (api/gateway/metering.py)
        self.metering = Metering(
            settings, KeyStore(self.redis, self.keys, settings.key_cache_s), self.metrics
        )

    async def start(self) -> None:
        """Take the gateway lease, start the output bus and the queue manager.

        Redis may be away or refuse writes now (a gateway started before its Redis, or rolled
        out while Redis is full): the gateway starts all the same, answers ``/readyz`` with 503
        and refuses clients, and its loops take the lease and subscribe once Redis answers.
        """
        try:
            await self._renew_lease()
        except ResponseError as exc:
            self._note_refusal(exc)
        except REDIS_OR_OS_ERRORS as exc:
            self._note_unreachable(exc)
        if self.redis_unreachable is None:
            await self._check_redis()
        await self.bus.start()
        await self.queue.start()
        self.liveness.start()
        self.recorder.start()
        await self.metering.start()
        self._lease_task = asyncio.create_task(self._lease_loop(), name="gateway-lease")
        log.info("gateway %s up (redis %s)", self.gateway_id, redact_url(self.settings.redis_url))

    async def drain(self, grace_s: float = 0.0) -> None:
        """Take no new connection; let running sessions finish for up to ``grace_s``, then end
        the rest with server_shutdown and wait until their handlers are done.

        Clients still waiting in the queue are told at once: they hold no slot, and another
        gateway can admit them now.
        """
        self.shutting_down = True
        queued = [h for h in self.sessions.values() if str(h.state).upper() == "QUEUED"]
        await asyncio.gather(*(h.shutdown() for h in queued), return_exceptions=True)
        if grace_s > 0 and self.sessions:
            log.info(
                "gateway %s draining: %d session(s) may go on for %.0f s",
                self.gateway_id,
                len(self.sessions),
                grace_s,
            )
            deadline = time.monotonic() + grace_s
            while self.sessions and time.monotonic() < deadline:  # noqa: ASYNC110 - see below
                await asyncio.sleep(0.2)
        handlers = list(self.sessions.values())
        if handlers:
            await asyncio.gather(*(h.shutdown() for h in handlers), return_exceptions=True)
        while self.sessions:  # noqa: ASYNC110 - handlers leave the dict from their own tasks
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """Drain, then release everything."""
        try:
            await asyncio.wait_for(self.drain(), 5.0)
        except TimeoutError:
            log.warning("%d sessions still open at shutdown", len(self.sessions))
        await self.queue.stop()
        await self.metering.stop()
        await asyncio.to_thread(self.waiting_events.close)  # the last task-revoked events sent
        await self.sender.aclose()
        await asyncio.to_thread(self.recorder.stop)  # the ended sessions' recordings written
        if self._lease_task:
            self._lease_task.cancel()
        await self.watch.stop()
        await self.liveness.stop()
        await self.bus.stop()
        await self.stops.aclose()
        await self.inputs.aclose()
        try:
            await self.redis.delete(self.keys.gateway_alive(self.gateway_id))
        except Exception:  # noqa: BLE001 - Redis gone: the key expires by itself
            log.warning("could not delete the alive key of gateway %s", self.gateway_id)
        await self.redis.aclose()

    async def ensure_lease(self) -> None:
        """Take the lease at once when the last renewal failed (raises when it fails again): a
        worker ends a session whose gateway holds no lease, so none may start before it."""
        if self.redis_unreachable is None:
            return
        try:
            await self._renew_lease()
        except ResponseError as exc:
            self._note_refusal(exc)
            raise
        self._note_accepted()

    async def _renew_lease(self) -> None:
        """Renew the lease; a key found gone after a renewal went through (Redis lost its keys,
        or the lease lapsed) tells the queue its missing tickets are lost."""
        was = await self.redis.set(
            self.keys.gateway_alive(self.gateway_id),
            b"1",
            px=int(self.settings.gateway_lease_ttl_s * 1000),
            get=True,
        )
        if was is None and self._lease_renewed:
            log.warning("gateway %s: its lease key was gone; lost tickets go back", self.gateway_id)
            self.queue.keys_lost()
        self._lease_renewed = True

    async def _lease_loop(self) -> None:
        reap_every = 10
        n = 0
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            try:
                await self._renew_lease()
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:  # Redis answers, but takes no write
                self._note_refusal(exc)
                await self._check_redis()  # (a replica, say)
                continue
            except REDIS_OR_OS_ERRORS as exc:
                self._note_unreachable(exc)
                continue
            except Exception:  # anything else: the loop must go on (it keeps the lease)
                log.warning("gateway lease renewal failed", exc_info=True)
                continue
            self._note_accepted()
            await self._check_redis()
            try:
                await self._count_slots()  # admission then reads a fresh count, not Redis
                n += 1
                if n % reap_every == 0:
                    await self.admission.reap_busy()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("could not count the worker slots", exc_info=True)

    def _note_refusal(self, exc: ResponseError) -> None:
        """Redis refused the lease's renewal (``maxmemory`` reached with ``noeviction``; a failed
        save: ``MISCONF``; a replica: ``READONLY``): no lease anywhere can be renewed
        (``streaming/stalls.py``)."""
        self.liveness.stalls.writes_refused()
        if self.writes_refused is None:
            log.error(
                "Redis refuses writes (%s): leases read as held and new clients are refused "
                "until it takes them again",
                exc,
            )
        self.writes_refused = str(exc)

    async def _check_redis(self) -> None:
        """Read what Redis lacks of omniserve's requirements once a minute (and at once after
        an outage: it may be another server now); each newly unmet one is logged."""
        if time.monotonic() - self._requirements_read_at < REQUIREMENTS_EVERY_S:
            return
        self._requirements_read_at = time.monotonic()
        try:
            unmet = await redis_requirements.check(self.redis)
        except REDIS_OR_OS_ERRORS as exc:  # (INFO disabled, say: read again in a minute)
            log.warning("could not read Redis's configuration: %s", exc)
            return
        for note in unmet:
            if note not in self.redis_unmet:
                log.error("%s (docs/OPERATIONS.md: Redis requirements)", note)
        self.redis_unmet = unmet

    def _note_unreachable(self, exc: Exception) -> None:
        """The lease could not be renewed: Redis is away (or the renewal timed out). Logged
        once per outage, not at every heartbeat; sessions' leases are judged as always
        (``api/gateway/liveness.py``)."""
        if self.redis_unreachable is None:
            log.warning(
                "gateway %s cannot reach Redis %s (%s); retrying every %.1f s",
                self.gateway_id,
                redact_url(self.settings.redis_url),
                exc,
                self.settings.heartbeat_interval_s,
            )
        self.redis_unreachable = str(exc)
        self._requirements_read_at = 0.0

    def _note_accepted(self) -> None:
        if self.redis_unreachable is not None:
            log.warning("gateway %s reaches Redis again", self.gateway_id)
            self.redis_unreachable = None
        self.liveness.stalls.writes_accepted()
        if self.writes_refused is not None:
            log.warning(
                "Redis takes writes again; leases settle for %.1f s", self.liveness.stalls.settle_s
            )
            self.writes_refused = None
            self._requirements_read_at = 0.0  # (a replica made primary again, say)

    async def submit(
        self, job: Job, with_values: Mapping[str, tuple[bytes, int]] | None = None
    ) -> None:
        """Send a task to the queue of the worker that owns the job's slot (``with_values``:
        keys the task reads, written before it: in one transaction with it when the broker is
        the shared Redis)."""
        # from the event loop, not send_task in a thread, unless the broker is RabbitMQ
        # (api/gateway/task_submit.py says why)
        await self.sender.submit(job, worker_queue(slot_worker(job.slot_id)), with_values)

    async def abandon(self, session_id: str, slot_id: str) -> bool:
        """A task that has not started: make sure it never starts, and free its slot.

        Returns False when the worker claimed the session first (it is running after all).
        """
        claimed = await self.redis.set(
            self.keys.session_claim(session_id),
            b"abandoned",
            nx=True,
            ex=int(self.settings.session_ttl_s),
        )
        if claimed:
            await self.admission.release(slot_id)
        return bool(claimed)

    async def session_alive(self, session_id: str) -> bool:
        """Whether the worker running a session still renews its lease."""
        return bool(await self.redis.exists(self.keys.session_lease(session_id)))

    async def worker_count(self) -> int:
        """Live slots in the pool that serve now."""
        return await self.admission.live_slot_count()

    async def has_workers(self) -> bool:
        """Whether any live worker slot exists or is loading (cached for a second).

        A worker still loading its model is coming capacity: clients queue for it. The lease
        loop recounts every ``heartbeat_interval_s``, so a new session or chat turn normally
        waits for no Redis read here: its path to the enqueue stays at two round trips. "None"
        is always read afresh: a worker that just came up serves the next client at once.
        """
        if self._live_slots == 0 or time.monotonic() - self._slots_checked_at > 1.0:
            await self._count_slots()
        return self._live_slots > 0

    async def _count_slots(self) -> None:
        now = time.monotonic()
        cap = await self.admission.capacity()
        self._live_slots = cap.ready + cap.loading
        self._slots_checked_at = now
