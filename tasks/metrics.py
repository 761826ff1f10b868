"""A worker process's Prometheus metrics, served by that process on its own HTTP port.

Why a per-process endpoint (``OMNISERVE_WORKER_METRICS_PORT``) and not prometheus_client's
multiprocess mode or a push through Redis: one worker process per GPU holds the backend and runs
every session of its node (prefork with one pool process, or one threads-pool process), so that
process alone knows its slots, steps and GPU memory; it serves them from a daemon thread without
a shared directory to clean up after dead processes. The endpoint starts before the model loads,
so ``loading`` slots are visible (the readiness probe, ``deploy/probes/worker_ready.py``, reads
them). A pool process that the parent replaces serves the same port again. The counters that
must survive it (``PERSISTED``: a hung step restarts the process, a killed session is counted by
the parent) are kept per node in Redis (``Keys.node_counters``) and read from there at scrape
time (one HGETALL; the last values known while Redis is away), so they never go backwards.

Names, types and labels are the contract in ``deploy/dashboards/metric_names.txt``.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import redis
from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omnicore.gc_pauses import GcPauseCollector, gc_pauses
from streaming.outage import REDIS_ERRORS

log = logging.getLogger("omniserve.worker")

# no *_created series: the contract names every series, and Prometheus does not need them
disable_created_metrics()  # type: ignore[no-untyped-call]

STEP_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.85, 1, 1.25, 1.5, 2, 3, 5)

SLOT_STATES = ("loading", "idle", "busy", "quarantined", "draining")
#: counters kept per node in Redis (a hung step or a killed pool process ends the process),
#: with the number of their labels
PERSISTED = {
    "omniserve_backend_step_timeouts_total": 1,
    "omniserve_worker_sessions_total": 2,
    "omniserve_duplex_rollovers_total": 1,
}
SEP = "|"  # between a persisted counter's name and its label values in the Redis field
# a node's hash lives this long after its last write: node names are new on each worker start
NODE_COUNTERS_TTL_S = 7 * 24 * 3600


def persist(client: redis.Redis, key: str, field: str) -> None:
    """Add one to a node's persisted counter and keep its hash for ``NODE_COUNTERS_TTL_S``."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hincrby(key, field, 1)
        pipe.expire(key, NODE_COUNTERS_TTL_S)
        pipe.execute()


def killed_field(kind: str) -> str:
    """The persisted field counting ``kind`` sessions whose pool process died under them (the
    parent's supervisor writes it; the next pool process serves it)."""
    return SEP.join(("omniserve_worker_sessions_total", kind, "killed"))


class SlotView(Protocol):
    """What the slot gauge reads of the worker runtime (``tasks.runtime.WorkerRuntime``)."""

    worker_id: str
    slot_ids: list[str]
    active: dict[str, str]
    quarantined: set[str]
    lock: threading.Lock
    ready: threading.Event
    shutting_down: threading.Event


def slot_states(rt: SlotView) -> dict[str, int]:
    """Slots of one process by state: loading (model not ready), idle, busy, quarantined (a
    hung step holds it), draining (idle but offered to no one: the worker drains)."""
    counts = dict.fromkeys(SLOT_STATES, 0)
    with rt.lock:
        busy, hung = set(rt.active), set(rt.quarantined)
    for slot in rt.slot_ids:
        if slot in busy:
            counts["busy"] += 1
        elif slot in hung:
            counts["quarantined"] += 1
        elif not rt.ready.is_set():
            counts["loading"] += 1
        elif rt.shutting_down.is_set():
            counts["draining"] += 1
        else:
            counts["idle"] += 1
    return counts


class _SlotsAndGpu(Collector):
    """Read at scrape time: slots per state, and CUDA memory when torch and a GPU are there."""

    def __init__(self, runtime: SlotView) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        slots = GaugeMetricFamily(
            "omniserve_worker_slots",
            "Slots of this worker process by state.",
            labels=["worker", "state"],
        )
        for state, n in slot_states(self.runtime).items():
            slots.add_metric([self.runtime.worker_id, state], n)
        yield slots
        gpu = GaugeMetricFamily(
            "omniserve_gpu_memory_bytes",
            "CUDA memory of this process: allocated, reserved (by its caching allocator), total.",
            labels=["device", "kind"],
        )
        for device, kind, value in gpu_memory():
            gpu.add_metric([device, kind], value)
        yield gpu


def gpu_memory() -> Iterable[tuple[str, str, float]]:
    """(device, kind, bytes) of each visible CUDA device, if this process has imported torch
    (never imported here: a scripted or pocket worker has no GPU to report)."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            device = f"cuda:{i}"
            out.append((device, "allocated", float(torch.cuda.memory_allocated(i))))
            out.append((device, "reserved", float(torch.cuda.memory_reserved(i))))
            out.append((device, "total", float(torch.cuda.get_device_properties(i).total_memory)))
        return out
    except Exception:
        log.debug("GPU memory query failed", exc_info=True)
        return []


class PersistedCounters(Collector):
    """The counters of ``PERSISTED``, kept per node in Redis and read from there at scrape time.

    A pool process can die right after counting (a hung step restarts it; the parent counts a
    killed session after the process is gone, maybe after its replacement started), so the node's
    Redis hash is the truth and every process of the node serves it. Values never go backwards:
    each field is the larger of what Redis holds and what this process counted or last read
    (a write lost to a Redis outage, a scrape while Redis is away).
    """

    def __init__(self) -> None:
        self.client: redis.Redis | None = None
        self.key = ""
        self.values: dict[str, float] = {}  # field (name|labels) -> count
        self.lock = threading.Lock()

    def count(self, name: str, *labels: str) -> None:
        if name not in PERSISTED:
            raise ValueError(f"{name} is not a persisted counter")
        field = SEP.join((name, *labels))
        with self.lock:
            self.values[field] = self.values.get(field, 0.0) + 1
        if self.client is not None:
            try:
                persist(self.client, self.key, field)
            except REDIS_ERRORS:
                log.warning("could not persist %s", field)

    def _read(self) -> dict[str, float]:
        stored: dict[str, float] = {}
        if self.client is not None:
            try:
                raw = self.client.hgetall(self.key)
            except REDIS_ERRORS:
                raw = {}  # Redis away: serve what was last known
            for raw_field, raw_value in raw.items():
                name = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
                stored[name] = float(raw_value)
        with self.lock:
            for name, count in stored.items():
                self.values[name] = max(self.values.get(name, 0.0), count)
            return dict(self.values)

    def collect(self) -> Iterator[Metric]:
        families = {
            "omniserve_backend_step_timeouts_total": CounterMetricFamily(
                "omniserve_backend_step_timeouts",
                "Backend calls that overran OMNISERVE_STEP_TIMEOUT_S (their session was ended).",
                labels=["backend"],
            ),
            "omniserve_worker_sessions_total": CounterMetricFamily(
                "omniserve_worker_sessions",
                "Sessions and chat turns of this node, by kind (duplex, chat) and outcome.",
                labels=["kind", "outcome"],
            ),
            "omniserve_duplex_rollovers_total": CounterMetricFamily(
                "omniserve_duplex_rollovers",
                "Rollovers: a duplex session going on in a fresh model session, primed.",
                labels=["backend"],
            ),
        }
        for field, value in sorted(self._read().items()):
            name, *labels = field.split(SEP)
            family = families.get(name)
            if family is not None and len(labels) == PERSISTED[name]:  # else an old layout
                family.add_metric(labels, value)
        yield from families.values()


class WorkerMetrics:
    """The worker metrics of the contract on one registry, and the endpoint that serves it."""

    def __init__(self, runtime: SlotView, backend: str) -> None:
        self.backend = backend
        r = self.registry = CollectorRegistry(auto_describe=True)
        r.register(_SlotsAndGpu(runtime))
        r.register(GcPauseCollector(gc_pauses()))  # this process's collections (and frozen heap)
        self.step_rtf = Histogram(
            "omniserve_duplex_step_rtf",
            "Duplex step wall time / seconds of audio consumed (above 1: slower than real time).",
            ["backend"],
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.step_seconds = Histogram(
            "omniserve_duplex_step_seconds",
            "Wall time of one duplex backend step.",
            ["backend"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.load_seconds = Gauge(
            "omniserve_backend_load_seconds",
            "How long this process took to load its backend.",
            ["backend"],
            registry=r,
        )
        self.persisted = PersistedCounters()
        r.register(self.persisted)
        self._server: Any = None

    def keep_in_redis(self, client: redis.Redis, key: str) -> None:
        """Serve this node's persisted counters from Redis, and keep adding to them there."""
        self.persisted.client, self.persisted.key = client, key

    def count(self, name: str, *labels: str) -> None:
        """Add one to a persisted counter (here and, once kept in Redis, there)."""
        self.persisted.count(name, *labels)

    # ------------------------------------------------------------------ observations
    def step(self, seconds: float, audio_seconds: float) -> None:
        """One duplex step took ``seconds`` for ``audio_seconds`` of input."""
        self.step_seconds.labels(self.backend).observe(seconds)
        if audio_seconds > 0:
            self.step_rtf.labels(self.backend).observe(seconds / audio_seconds)

    def loaded(self, seconds: float) -> None:
        """The backend finished loading."""
        self.load_seconds.labels(self.backend).set(seconds)

    # ------------------------------------------------------------------ endpoint
    def serve(self, host: str, port: int) -> bool:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread (port 0: not at all).

        A port already taken (another worker on this host with the same setting) is logged and
        skipped: metrics must never keep a worker from serving.
        """
        if port <= 0:
            return False
        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            log.warning("worker metrics not served on %s:%d: %s", host, port, exc)
            return False
        log.info("worker metrics on http://%s:%d/metrics", host, port)
        return True
