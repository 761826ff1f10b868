"""The worker's metric registry against the contract (deploy/dashboards/metric_names.txt), its
slot and GPU gauges, and its counters carried on through Redis from one pool process to the next.
The metrics of a running worker: tests/e2e/test_metrics.py."""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from omniserve.redis_server import free_port
from tasks.metrics import NODE_COUNTERS_TTL_S, WorkerMetrics, killed_field
from tests.support.metric_contract import exposed, of_process


class FakeCuda:
    """torch.cuda's memory queries for one 80 GB device (no GPU here; the real API's shape)."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def memory_allocated(i: int) -> int:
        return 3 * 2**30

    @staticmethod
    def memory_reserved(i: int) -> int:
        return 4 * 2**30

    @staticmethod
    def get_device_properties(i: int) -> Any:
        return types.SimpleNamespace(total_memory=80 * 2**30)


class Runtime:
    """The slot state a worker runtime holds (tasks.metrics.SlotView)."""

    def __init__(self) -> None:
        self.worker_id = "node#1"
        self.slot_ids = ["node#1|0", "node#1|1"]
        self.active = {"node#1|1": "rt_1"}
        self.quarantined: set[str] = set()
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.shutting_down = threading.Event()


def slot_gauge(m: WorkerMetrics) -> dict[str, float]:
    return {
        s.labels["state"]: s.value
        for f in m.registry.collect()
        if f.name == "omniserve_worker_slots"
        for s in f.samples
    }


def test_worker_registry_is_the_worker_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=FakeCuda))
    rt = Runtime()
    m = WorkerMetrics(rt, "scripted")
    m.step(0.5, 1.0)
    m.loaded(2.0)
    m.count("omniserve_backend_step_timeouts_total", "scripted")
    m.count("omniserve_worker_sessions_total", "duplex", "completed")
    m.count("omniserve_duplex_rollovers_total", "scripted")
    want = of_process("worker")
    assert exposed(m.registry) == {n: (w.type, w.labels) for n, w in want.items()}
    gpu = {
        s.labels["kind"]: s.value
        for f in m.registry.collect()
        if f.name == "omniserve_gpu_memory_bytes"
        for s in f.samples
    }
    assert gpu == {"allocated": 3 * 2**30, "reserved": 4 * 2**30, "total": 80 * 2**30}
    assert slot_gauge(m)["loading"] == 1 and slot_gauge(m)["busy"] == 1
    rt.ready.set()
    assert slot_gauge(m)["idle"] == 1
    rt.shutting_down.set()
    assert slot_gauge(m) == {"loading": 0, "idle": 0, "busy": 1, "quarantined": 0, "draining": 1}


def test_worker_counters_continue_from_redis(sync_redis: Any, keys: Any) -> None:
    key = keys.node_counters("node")
    sync_redis.hset(key, killed_field("duplex"), 2)
    m = WorkerMetrics(Runtime(), "scripted")
    m.keep_in_redis(sync_redis, key)
    m.count("omniserve_worker_sessions_total", "duplex", "killed")
    again = WorkerMetrics(Runtime(), "scripted")  # the next pool process of the node
    again.keep_in_redis(sync_redis, key)
    value = again.registry.get_sample_value(
        "omniserve_worker_sessions_total", {"kind": "duplex", "outcome": "killed"}
    )
    assert value == 3
    assert 0 < sync_redis.ttl(key) <= NODE_COUNTERS_TTL_S  # a node's hash does not live forever
    # Redis away: the last values known are served, never less
    again.persisted.client = redis.Redis(
        port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )  # (no retries: redis-py's default backs off between them)
    labels = {"kind": "duplex", "outcome": "killed"}
    assert again.registry.get_sample_value("omniserve_worker_sessions_total", labels) == 3
