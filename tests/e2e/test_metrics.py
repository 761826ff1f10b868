"""The metrics of running gateways and workers: histograms and counters move as real sessions run,
and a worker serves the contract's names (deploy/dashboards/metric_names.txt). The registries
against the contract, without processes: tests/unit/api/metrics/test_registry.py and
tests/unit/tasks/test_metrics.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from omniserve.redis_server import free_port
from tests.support.client import Client, silence, speech
from tests.support.metric_contract import of_process
from tests.support.metrics_scrape import scrape, total, wait_for, worker_metrics_url
from tests.support.stack import ROOT, Stack


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
