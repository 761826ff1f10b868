"""The metrics of gateways and workers against the contract (deploy/dashboards/metric_names.txt):
every contract name exists with its type and labels, and nothing outside the contract is served.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import types
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics.registry import GatewayMetrics
from omniserve.redis_server import free_port
from tasks.metrics import NODE_COUNTERS_TTL_S, WorkerMetrics, killed_field
from tests.support.client import Client, silence, speech
from tests.support.metric_contract import Metric, contract
from tests.support.metrics_scrape import scrape, total, wait_for, worker_metrics_url
from tests.support.stack import ROOT, Stack


def exposed(registry: CollectorRegistry) -> dict[str, tuple[str, frozenset[str]]]:
    """Name (counters with _total) -> (type, label names of its samples) of each family that a
    registry serves, read back through the text format and prometheus_client's parser."""
    out = {}
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = frozenset(k for smp in family.samples for k in smp.labels if k != "le")
        out[name] = (family.type, labels)
    return out


def of_process(process: str) -> dict[str, Metric]:
    return {n: m for n, m in contract().items() if process in m.process.split(",")}


def test_gateway_registry_is_the_gateway_contract() -> None:
    m = GatewayMetrics()
    m.refresh([("audio", "ACTIVE")], 0)
    for hist in (m.queue_wait, m.first_text, m.first_audio, m.input_dropped):
        hist.labels("audio")
    for plain in (m.admission_handoff, m.relay_latency, m.output_gaps, m.client_playback_gaps):
        assert plain is not None
    m.errors.labels("queue_full")
    m.closes.labels("audio", "user_stop")
    m.rejected.labels("unauthorized")
    m.clients_dropped.labels("client_idle")
    m.key_usage.labels("acme", "audio_in_s")
    want = of_process("gateway")
    assert exposed(m.registry) == {n: (w.type, w.labels) for n, w in want.items()}


def test_gateway_exposition_parses_and_refresh_sets_the_state_gauges() -> None:
    m = GatewayMetrics()
    m.refresh([("audio", "ACTIVE"), ("audio", "ACTIVE"), ("chat", "QUEUED")], 7)
    m.queue_wait.labels("audio").observe(0.3)
    m.errors.labels("queue_full").inc()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(m.exposition().decode())
        for s in f.samples
    }
    assert samples[("omniserve_sessions", (("mode", "audio"), ("state", "active")))] == 2
    assert samples[("omniserve_sessions", (("mode", "chat"), ("state", "queued")))] == 1
    assert samples[("omniserve_queue_waiting", ())] == 7
    assert samples[("omniserve_queue_wait_seconds_count", (("mode", "audio"),))] == 1
    assert samples[("omniserve_errors_total", (("code", "queue_full"),))] == 1
    m.refresh([("chat", "QUEUED")], None)  # a session left; Redis did not answer
    after = {s.name: s for f in m.registry.collect() for s in f.samples}
    assert after["omniserve_queue_waiting"].value == 7
    assert m.totals()["omniserve_errors_total"] == 1


# --------------------------------------------------------------------------- real processes


async def test_gateway_histograms_move_during_a_real_duplex_session(service: Stack) -> None:
    url = f"http://127.0.0.1:{service.gateways[0][1]}/metrics"
    before = scrape(url)
    c = await Client.connect(service.url(), query="?mode=audio")
    await c.init()
    during = scrape(url)
    assert total(during, "omniserve_sessions", mode="audio", state="active") == 1
    frames = []
    for audio_in in (speech(), silence(), silence()):
        frames += await c.step(audio_in)
    kinds = {f.get("kind") for f in frames if f["type"] == "response.output.delta"}
    assert {"text", "audio"} <= kinds, frames
    await c.send({"type": "session.close"})
    await c.until("session.closed")
    await c.close()
    after = await wait_for(
        url, lambda s: total(s, "omniserve_session_closes_total", mode="audio") >= 1
    )
    for hist in (
        "omniserve_queue_wait_seconds",
        "omniserve_first_text_seconds",
        "omniserve_first_audio_seconds",
        "omniserve_relay_latency_seconds",
    ):
        assert total(after, f"{hist}_count") > total(before, f"{hist}_count"), hist
        assert total(after, f"{hist}_bucket", le="+Inf") == total(after, f"{hist}_count")
    assert total(after, "omniserve_first_text_seconds_count", mode="audio") == 1
    assert total(after, "omniserve_session_closes_total", mode="audio", reason="user_stop") == 1
    assert total(after, "omniserve_sessions", state="active") == 0


async def test_gateway_counts_errors_by_code_and_rejections(service: Stack) -> None:
    url = f"http://127.0.0.1:{service.gateways[0][1]}/metrics"
    c = await Client.connect(service.url(), query="?mode=audio")
    await c.until("session.queue_done", timeout=30)
    await c.send({"type": "no.such.event"})
    assert (await c.until("error"))["error"]["code"] == "unknown_event"
    await c.close()
    bad = await Client.connect(service.url(), query="?mode=nonsense")
    await bad.closed()
    samples = await wait_for(
        url, lambda s: total(s, "omniserve_session_closes_total", reason="client_closed") >= 1
    )
    assert total(samples, "omniserve_errors_total", code="unknown_event") == 1
    assert total(samples, "omniserve_connections_rejected_total", reason="invalid_mode") == 1


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
    again.persisted.client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    labels = {"kind": "duplex", "outcome": "killed"}
    assert again.registry.get_sample_value("omniserve_worker_sessions_total", labels) == 3


async def test_worker_histograms_move_during_a_real_session(stack: Stack) -> None:
    url = worker_metrics_url(stack)
    stack.start_gateway()
    before = await asyncio.to_thread(scrape, url)
    assert total(before, "omniserve_worker_slots", state="idle") == 1
    assert total(before, "omniserve_backend_load_seconds", backend="scripted") >= 0
    c = await Client.connect(stack.url(), query="?mode=audio")
    await c.init()
    assert total(await asyncio.to_thread(scrape, url), "omniserve_worker_slots", state="busy") == 1
    for audio_in in (speech(), silence(), silence()):
        await c.step(audio_in)
    await c.send({"type": "session.close"})
    await c.until("session.closed")
    after = await wait_for(
        url, lambda s: total(s, "omniserve_worker_sessions_total", kind="duplex") >= 1
    )
    assert total(after, "omniserve_worker_sessions_total", kind="duplex", outcome="completed") == 1
    for hist in ("omniserve_duplex_step_seconds", "omniserve_duplex_step_rtf"):
        assert total(after, f"{hist}_count", backend="scripted") == 3, hist
        assert total(before, f"{hist}_count") == 0
    assert total(after, "omniserve_worker_slots", state="idle") == 1
    names = {f.name for f in text_string_to_metric_families(httpx.get(url).text)}
    contract_names = {n.removesuffix("_total") for n in of_process("worker")}
    assert contract_names - names == {"omniserve_gpu_memory_bytes"} or contract_names <= names
    # the readiness probe of the worker image reads this same endpoint
    probe = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "probes" / "worker_ready.py")],
        env={**os.environ, "OMNISERVE_WORKER_METRICS_PORT": url.split(":")[2].split("/")[0]},
        capture_output=True,
        timeout=30,
    )
    assert probe.returncode == 0, probe.stderr


async def test_admission_handoff_and_queue_wait_of_a_queued_client(service: Stack) -> None:
    url = f"http://127.0.0.1:{service.gateways[0][1]}/metrics"
    first = await Client.connect(service.url(), query="?mode=audio")
    await first.init()
    second = await Client.connect(service.url(), query="?mode=audio")
    assert (await second.until("session.queued"))["position"] == 1
    queued = await wait_for(url, lambda s: total(s, "omniserve_queue_waiting") == 1)
    assert total(queued, "omniserve_sessions", mode="audio", state="queued") == 1
    await first.send({"type": "session.close"})
    await first.until("session.closed")
    await second.init()  # session.queue_done, then created
    after = await wait_for(
        url, lambda s: total(s, "omniserve_admission_handoff_seconds_count") >= 1
    )
    assert total(after, "omniserve_admission_handoff_seconds_count") == 1
    assert total(after, "omniserve_queue_wait_seconds_count", mode="audio") == 2
    assert total(after, "omniserve_queue_waiting") == 0
    await second.close()


async def test_chat_turns_move_first_text_and_close_counters(service: Stack) -> None:
    url = f"http://127.0.0.1:{service.gateways[0][1]}/metrics"
    c = await Client.connect(service.url(), query="?mode=chat")
    await c.init()
    turn = {"messages": [{"role": "user", "content": "Reply with exactly: counted"}]}
    await c.send({"type": "input.append", "input": {**turn, "streaming": True}})
    await c.until("response.done")
    await c.send({"type": "session.close", "reason": "bye for now"})  # a client's own words
    assert (await c.until("session.closed"))["reason"] == "bye for now"
    legacy = await Client.connect(service.url(), path="/ws/chat")
    await legacy.send({**turn, "streaming": True})
    assert (await legacy.until("done"))["text"] == "counted"
    after = await wait_for(
        url, lambda s: total(s, "omniserve_session_closes_total", mode="chat") >= 2
    )
    assert total(after, "omniserve_first_text_seconds_count", mode="chat") == 2
    assert total(after, "omniserve_queue_wait_seconds_count", mode="chat") == 2
    # one label value for every reason a client makes up: clients cannot create series at will
    assert total(after, "omniserve_session_closes_total", reason="client_reason") == 1
    assert total(after, "omniserve_session_closes_total", mode="chat", reason="done") == 1


def test_a_threads_pool_worker_serves_all_its_slots(stack: Stack) -> None:
    port = free_port()
    stack.start_worker(
        slots=3, OMNISERVE_WORKER_METRICS_PORT=str(port), OMNISERVE_WORKER_METRICS_HOST="127.0.0.1"
    )
    samples = scrape(f"http://127.0.0.1:{port}/metrics")
    assert total(samples, "omniserve_worker_slots", state="idle") == 3
    assert total(samples, "omniserve_worker_slots") == 3


async def test_dropped_input_chunks_are_counted_as_the_worker_reports_them(stack: Stack) -> None:
    # long leases: the worker is stopped below and must not be taken for dead meanwhile
    worker = stack.start_worker(OMNISERVE_LEASE_TTL_S="60")
    port = stack.start_gateway(OMNISERVE_INPUT_MAX_PENDING="1", OMNISERVE_LEASE_TTL_S="60")
    url = f"http://127.0.0.1:{port}/metrics"
    c = await Client.connect(stack.url(), query="?mode=audio")
    sid = (await c.init())["session_id"]
    await c.step(silence())  # input_1 answered: the worker waits on its streams
    key = stack.keys.input_audio(sid)

    def last_seq() -> int:
        last = stack.redis().xrevrange(key, count=1)
        return int(last[0][1][b"seq"]) if last else 0

    os.killpg(worker.popen.pid, signal.SIGSTOP)  # the client now sends faster than it steps
    try:
        for _ in range(11):
            await c.send({"type": "input.append", "input": {"audio": silence()}})
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(last_seq) != 12:
            assert time.monotonic() < deadline, "input_12 never reached the input stream"
            await asyncio.sleep(0.05)
    finally:
        os.killpg(worker.popen.pid, signal.SIGCONT)
    while True:
        ev = await c.until("response.output.delta", timeout=20)
        if ev["input_id"] == "input_12":
            break
    reported = ev["metrics"]["dropped_chunks"]
    assert reported >= 9
    samples = await wait_for(
        url, lambda s: total(s, "omniserve_input_dropped_chunks_total", mode="audio") >= reported
    )
    assert total(samples, "omniserve_input_dropped_chunks_total", mode="audio") == reported
    await c.close()
