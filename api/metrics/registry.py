"""The gateway's Prometheus metrics: one ``prometheus_client`` registry per gateway process.

Every name, type and label set is the metric contract in ``deploy/dashboards/metric_names.txt``
(``tests/e2e/test_metrics.py`` holds this module to it). The registry is per ``GatewayMetrics``
object rather than the library's global one, so that several apps in one process (tests) never
collide. Counters and histograms are moved where things happen (``api/metrics/telemetry.py``); the
gauges that describe a state (sessions, queue) are read at scrape time by ``refresh``.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from omnicore.gc_pauses import GcPauseCollector, gc_pauses

CONTENT_TYPE = CONTENT_TYPE_LATEST

# no *_created series: the contract names every series, and Prometheus does not need them
disable_created_metrics()  # type: ignore[no-untyped-call]

# Seconds buckets for waits that run from milliseconds (handoff) to minutes (the queue).
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Time to first output: the pocket backend is ~0.5-1 s, a loaded GPU a few seconds.
FIRST_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60)
# Relay latency, worker emit to gateway send: normally a few milliseconds.
RELAY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class GatewayMetrics:
    """The gateway metrics of the contract, on their own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        r.register(GcPauseCollector(gc_pauses()))  # this process's collections (and frozen heap)
        self.sessions = Gauge(
            "omniserve_sessions",
            "Sessions on this gateway by public mode and state (QUEUED ... ACTIVE, lower case).",
            ["mode", "state"],
            registry=r,
        )
        self.queue_waiting = Gauge(
            "omniserve_queue_waiting",
            "Tickets waiting in the global admission queue (every gateway reports the same).",
            registry=r,
        )
        self.queue_wait = Histogram(
            "omniserve_queue_wait_seconds",
            "Connect to admission (a worker slot assigned), per admitted session or chat turn.",
            ["mode"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.admission_handoff = Histogram(
            "omniserve_admission_handoff_seconds",
            "A queued ticket's assignment seen by its gateway to the client told queue_done.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.first_text = Histogram(
            "omniserve_first_text_seconds",
            "Start of a response (duplex: its input chunk sent; chat: the turn) to its first text.",
            ["mode"],
            buckets=FIRST_BUCKETS,
            registry=r,
        )
        self.first_audio = Histogram(
            "omniserve_first_audio_seconds",
            "Start of a response to its first audio.",
            ["mode"],
            buckets=FIRST_BUCKETS,
            registry=r,
        )
        self.relay_latency = Histogram(
            "omniserve_relay_latency_seconds",
            "Worker emit (the event's emitted_at) to the gateway's send to the client.",
            buckets=RELAY_BUCKETS,
            registry=r,
        )
        self.input_dropped = Counter(
            "omniserve_input_dropped_chunks",
            "Client audio chunks dropped because the worker fell behind (spec: silent drop).",
            ["mode"],
            registry=r,
        )
        self.output_gaps = Counter(
            "omniserve_output_gaps",
            "Output events lost beyond the replay log (each reported to its client).",
            registry=r,
        )
        self.errors = Counter(
            "omniserve_errors",
            "error events sent to clients, by error.code.",
            ["code"],
            registry=r,
        )
        self.closes = Counter(
            "omniserve_session_closes",
            "Sessions ended, by public mode and close reason.",
            ["mode", "reason"],
            registry=r,
        )
        self.key_usage = Counter(
            "omniserve_key_usage",
            "Usage by API key name and figure (streaming/usage.py: audio_in_s, audio_out_s, "
            "text_tokens_in, text_tokens_out, frames_in, queue_wait_s, worker_s, session_s, "
            "sessions, responses); key names past the label budget count as `other`.",
            ["key", "figure"],
            registry=r,
        )
        self.client_playback_gaps = Counter(
            "omniserve_client_playback_gaps",
            "Playback gaps that clients reported (their audio ran dry mid-response).",
            registry=r,
        )
        self.rejected = Counter(
            "omniserve_connections_rejected",
            "Connections refused before a session, by reason (an error code or a limit).",
            ["reason"],
            registry=r,
        )

        self.clients_dropped = Counter(
            "omniserve_clients_dropped",
            "Sessions the gateway ended because their client stopped keeping up: sent nothing "
            "(client_idle), stopped answering pings (ping_timeout), or did not read its output "
            "(output_backpressure).",
            ["reason"],
            registry=r,
        )

    def refresh(self, sessions: Iterable[tuple[str, str]], queue_waiting: int | None) -> None:
        """Set the state gauges: ``sessions`` as (mode, state) pairs, the global queue length
        (None: Redis did not answer, the last value stays)."""
        tally = Tally((mode, state.lower()) for mode, state in sessions)
        self.sessions.clear()
        for (mode, state), n in tally.items():
            self.sessions.labels(mode, state).set(n)
        if queue_waiting is not None:
            self.queue_waiting.set(queue_waiting)

    def exposition(self) -> bytes:
        """The text format of every metric (``/metrics``)."""
        return generate_latest(self.registry)

    def totals(self) -> dict[str, float]:
        """Each counter summed over its labels, for the operator page (``/v1/admin/overview``)."""
        out: dict[str, float] = {}
        for family in self.registry.collect():
            if family.type == "counter":
                out[family.name + "_total"] = sum(
                    s.value for s in family.samples if s.name.endswith("_total")
                )
        return out
