"""Writes grafana-omniserve.json, the Grafana dashboard on the metric contract (metric_names.txt).

The dashboard is generated rather than edited by hand so that every panel has the same shape and
every query can be read in one place; tests/deploy/test_dashboard.py checks that the committed
JSON is this script's output and that its queries use exactly the contract's names.

    python deploy/dashboards/build_dashboard.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("grafana-omniserve.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


def quantiles(metric: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> list[Q]:
    """p50/p90/p99 of a histogram, optionally split by one label."""
    group = f"le, {by}" if by else "le"
    split = f" {{{{{by}}}}}" if by else ""
    return [
        Q(
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{RATE}])))",
            f"p{round(q * 100)}{split}",
        )
        for q in qs
    ]


@dataclass
class Q:
    """One query of a panel and its legend."""

    expr: str
    legend: str = ""


@dataclass
class Panel:
    """A stat or time-series panel."""

    title: str
    queries: list[Q]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 8
    description: str = ""
    stack: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Overview",
        [
            Panel(
                "Active sessions",
                [Q('sum(omniserve_sessions{state="active"})')],
                kind="stat",
                width=4,
            ),
            Panel(
                "Waiting in the queue",
                [Q("max(omniserve_queue_waiting)")],
                kind="stat",
                width=4,
                description="Global queue (every gateway reports the same value: max).",
            ),
            Panel(
                "Worker slots serving",
                [Q('sum(omniserve_worker_slots{state=~"idle|busy"})')],
                kind="stat",
                width=4,
            ),
            Panel(
                "Busy slots",
                [
                    Q(
                        'sum(omniserve_worker_slots{state="busy"}) / sum(omniserve_worker_slots)',
                    )
                ],
                unit="percentunit",
                kind="stat",
                width=4,
                description="The workers' autoscaling signal (KEDA target 0.8).",
            ),
            Panel("Gateways", [Q("count(omniserve_queue_waiting)")], kind="stat", width=4),
            Panel(
                "Workers",
                [Q("count(count by (worker) (omniserve_worker_slots))")],
                kind="stat",
                width=4,
            ),
        ],
    ),
    (
        "Sessions and queue",
        [
            Panel(
                "Sessions by mode and state",
                [Q("sum by (mode, state) (omniserve_sessions)", "{{mode}} {{state}}")],
                stack=True,
            ),
            Panel(
                "Queue: waiting and slot demand",
                [
                    Q("max(omniserve_queue_waiting)", "waiting"),
                    Q(
                        '(sum(omniserve_worker_slots{state="busy"}) or vector(0))'
                        " + (max(omniserve_queue_waiting) or vector(0))",
                        "demand (busy + waiting)",
                    ),
                ],
                description="Slot demand is the workers' KEDA trigger.",
            ),
            Panel(
                "Queue wait (connect or chat turn to a slot assigned)",
                quantiles("omniserve_queue_wait_seconds"),
                unit="s",
            ),
            Panel(
                "Admission handoff (queued ticket assigned to queue_done sent)",
                quantiles("omniserve_admission_handoff_seconds"),
                unit="s",
            ),
            Panel(
                "Connections rejected by reason",
                [
                    Q(
                        f"sum by (reason) (rate(omniserve_connections_rejected_total[{RATE}]))",
                        "{{reason}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Session closes by reason",
                [
                    Q(
                        f"sum by (reason) (rate(omniserve_session_closes_total[{RATE}]))",
                        "{{reason}}",
                    )
                ],
                unit="ops",
                stack=True,
            ),
            Panel(
                "Clients dropped (idle, ping timeout, output backpressure)",
                [
                    Q(
                        f"sum by (reason) (rate(omniserve_clients_dropped_total[{RATE}]))",
                        "{{reason}}",
                    )
                ],
                unit="ops",
            ),
        ],
    ),
    (
        "Latency",
        [
            Panel(
                "Time to first text, by mode",
                quantiles("omniserve_first_text_seconds", "mode", (0.5, 0.9)),
                unit="s",
            ),
            Panel(
                "Time to first audio, by mode",
                quantiles("omniserve_first_audio_seconds", "mode", (0.5, 0.9)),
                unit="s",
            ),
            Panel(
                "Relay latency (worker emit to gateway send)",
                quantiles("omniserve_relay_latency_seconds"),
                unit="s",
            ),
        ],
    ),
    (
        "Stream quality and errors",
        [
            Panel(
                "Input chunks dropped, by mode",
                [
                    Q(
                        f"sum by (mode) (rate(omniserve_input_dropped_chunks_total[{RATE}]))",
                        "{{mode}}",
                    )
                ],
                unit="ops",
                width=6,
            ),
            Panel(
                "Output gaps (server) and playback gaps (clients)",
                [
                    Q(f"sum(rate(omniserve_output_gaps_total[{RATE}]))", "output gaps"),
                    Q(
                        f"sum(rate(omniserve_client_playback_gaps_total[{RATE}]))",
                        "client playback gaps",
                    ),
                ],
                unit="ops",
                width=6,
            ),
            Panel(
                "Error events by code",
                [Q(f"sum by (code) (rate(omniserve_errors_total[{RATE}]))", "{{code}}")],
                unit="ops",
                width=12,
                stack=True,
            ),
        ],
    ),
    (
        "Usage by API key",
        [
            Panel(
                "Session-minutes per hour, by key",
                [
                    Q(
                        'sum by (key) (increase(omniserve_key_usage_total{figure="session_s"}'
                        "[1h])) / 60",
                        "{{key}}",
                    )
                ],
                width=12,
                stack=True,
                description="What the minutes_per_day quotas count (docs/OPERATIONS.md).",
            ),
            Panel(
                "Worker seconds per second, by key",
                [
                    Q(
                        'sum by (key) (rate(omniserve_key_usage_total{figure="worker_s"}'
                        f"[{RATE}]))",
                        "{{key}}",
                    )
                ],
                width=12,
                stack=True,
                description="Backend compute time (GPU seconds on a GPU backend).",
            ),
        ],
    ),
    (
        "Workers",
        [
            Panel(
                "Slots by state",
                [Q("sum by (state) (omniserve_worker_slots)", "{{state}}")],
                stack=True,
            ),
            Panel(
                "Duplex step real-time factor, by backend",
                quantiles("omniserve_duplex_step_rtf", "backend", (0.5, 0.9)),
                description="Step wall time / audio seconds consumed: above 1 is slower than "
                "real time.",
            ),
            Panel(
                "Duplex step time, by backend",
                quantiles("omniserve_duplex_step_seconds", "backend", (0.5, 0.9)),
                unit="s",
            ),
            Panel(
                "Worker sessions by kind and outcome",
                [
                    Q(
                        f"sum by (kind, outcome) (rate(omniserve_worker_sessions_total[{RATE}]))",
                        "{{kind}} {{outcome}}",
                    )
                ],
                unit="ops",
                stack=True,
            ),
            Panel(
                "Step watchdog firings, by backend",
                [
                    Q(
                        "sum by (backend) "
                        f"(increase(omniserve_backend_step_timeouts_total[{RATE}]))",
                        "{{backend}}",
                    )
                ],
            ),
            Panel(
                "Rollovers into a fresh model session, by backend",
                [
                    Q(
                        f"sum by (backend) (increase(omniserve_duplex_rollovers_total[{RATE}]))",
                        "{{backend}}",
                    )
                ],
            ),
            Panel(
                "Backend load time",
                [Q("max by (backend) (omniserve_backend_load_seconds)", "{{backend}}")],
                unit="s",
            ),
            Panel(
                "GPU memory",
                [
                    Q(
                        "sum by (instance, device, kind) (omniserve_gpu_memory_bytes)",
                        "{{instance}} {{device}} {{kind}}",
                    )
                ],
                unit="bytes",
                width=24,
            ),
        ],
    ),
    (
        "Processes",
        [
            Panel(
                "Garbage collection pauses, p99 by job and generation",
                [
                    Q(
                        "histogram_quantile(0.99, sum by (le, job, generation) "
                        f"(rate(omniserve_gc_pause_seconds_bucket[{RATE}])))",
                        "{{job}} gen {{generation}}",
                    )
                ],
                unit="s",
                width=12,
                description="Every session of a process waits while it collects; a full "
                "collection (gen 2) walks only what was not frozen at startup.",
            ),
            Panel(
                "Objects frozen at startup, per process",
                [
                    Q(
                        "max by (job, instance) (omniserve_gc_frozen_objects)",
                        "{{job}} {{instance}}",
                    )
                ],
                width=12,
                description="0: OMNISERVE_GC_FREEZE is off (or the process has not started).",
            ),
        ],
    ),
]


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    height = 4 if p.kind == "stat" else 8
    targets = [
        {"refId": chr(ord("A") + i), "datasource": DS, "expr": q.expr, "legendFormat": q.legend}
        for i, q in enumerate(p.queries)
    ]
    custom: dict[str, Any] = {}
    if p.kind == "timeseries":
        custom = {
            "fillOpacity": 20 if p.stack else 0,
            "stacking": {"mode": "normal" if p.stack else "none"},
        }
    options: dict[str, Any] = (
        {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
        if p.kind == "stat"
        else {
            "legend": {"displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "multi"},
        }
    )
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": p.width, "h": height},
        "fieldConfig": {"defaults": {"unit": p.unit, "custom": custom}, "overrides": []},
        "options": options,
        "targets": targets,
    }


def render() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, row in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
            }
        )
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for p in row:
            if x + p.width > 24:
                x, y, row_h = 0, y + row_h, 0
            panels.append(_panel(p, pid, x, y))
            pid, x = pid + 1, x + p.width
            row_h = max(row_h, panels[-1]["gridPos"]["h"])
        y += row_h
    return {
        "title": "omniserve",
        "uid": "omniserve",
        "description": "Gateways and workers of omniserve, on the metric contract in "
        "deploy/dashboards/metric_names.txt. Generated by build_dashboard.py.",
        "tags": ["omniserve"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def main() -> None:
    OUT.write_text(json.dumps(render(), indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
