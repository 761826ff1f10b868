"""The gateway's metric registry against the contract (deploy/dashboards/metric_names.txt): every
contract name exists with its type and labels, nothing outside it is served, and ``refresh`` sets
the state gauges. The metrics of a running gateway: tests/e2e/test_metrics.py."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from api.metrics.registry import GatewayMetrics
from tests.support.metric_contract import exposed, of_process


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
