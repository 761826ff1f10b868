"""The metric contract (deploy/dashboards/metric_names.txt) and everything built on it: the
Grafana dashboard uses exactly its names, the alerts and the KEDA queries only its names (parsed
with a real PromQL parser), promtool accepts the alerts, and the worker readiness probe reads the
worker's slots from a real prometheus_client endpoint.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from omniserve.redis_server import free_port
from tests.support.deploy_tools import DEPLOY, K8S, promtool, run
from tests.support.metric_contract import contract

DASH = DEPLOY / "dashboards"
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
PROM_LABELS = {"le", "instance", "job"}  # added by histograms and by Prometheus


def uses(expr: str) -> tuple[set[str], set[str]]:
    """Metric names (histogram series mapped to their histogram) and label names in a query."""
    names: set[str] = set()
    labels: set[str] = set()
    histograms = {m.name for m in contract().values() if m.type == "histogram"}

    def visit(node: Any) -> None:
        kind = type(node).__name__
        if kind == "VectorSelector":
            name = node.name
            for suffix in HISTOGRAM_SERIES:
                if name.endswith(suffix) and name[: -len(suffix)] in histograms:
                    name = name[: -len(suffix)]
            names.add(name)
            labels.update(m.name for m in node.matchers.matchers)
        elif kind == "AggregateExpr" and node.modifier is not None:
            labels.update(node.modifier.labels)

    grafana = expr.replace("$__rate_interval", "5m")
    promql_parser.walk(promql_parser.parse(grafana), visit)
    return names, labels


def dashboard_exprs(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_the_contract_has_every_metric_and_its_labels() -> None:
    c = contract()
    assert len(c) == 25
    assert c["omniserve_sessions"].labels == {"mode", "state"}
    assert c["omniserve_worker_slots"].labels == {"worker", "state"}
    assert c["omniserve_worker_slots"].process == "worker"
    assert c["omniserve_queue_wait_seconds"].type == "histogram"
    assert c["omniserve_gc_pause_seconds"].process == "gateway,worker"


def test_committed_dashboard_is_the_generators_output() -> None:
    spec = importlib.util.spec_from_file_location("build_dashboard", DASH / "build_dashboard.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    committed = json.loads((DASH / "grafana-omniserve.json").read_text())
    assert committed == module.render(), "run: python deploy/dashboards/build_dashboard.py"


def test_dashboard_uses_exactly_the_contract() -> None:
    dash = json.loads((DASH / "grafana-omniserve.json").read_text())
    names: set[str] = set()
    labels: set[str] = set()
    for expr in dashboard_exprs(dash):
        n, lab = uses(expr)
        names |= n
        labels |= lab
    c = contract()
    assert names == set(c)
    assert labels <= set().union(*(m.labels for m in c.values())) | PROM_LABELS
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    queries = [p for p in dash["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in queries)


def test_alerts_and_autoscaler_use_only_contract_names() -> None:
    c = contract()
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "omniserve-alerts.yml").read_text())
    exprs = [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    scaled = yaml.safe_load((K8S / "keda" / "worker-scaledobject.yaml").read_text())
    exprs += [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]
    for expr in exprs:
        names, labels = uses(expr)
        assert names <= set(c), expr
        assert labels <= set().union(*(c[n].labels for n in names)) | PROM_LABELS, expr


def test_promtool_accepts_the_alerts() -> None:
    out = run(
        [str(promtool()), "check", "rules", str(DEPLOY / "prometheus" / "omniserve-alerts.yml")]
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.fixture
def worker_metrics() -> Any:
    """A real prometheus_client endpoint serving omniserve_worker_slots, as a worker would."""
    registry = CollectorRegistry()
    slots = Gauge("omniserve_worker_slots", "slots", ["worker", "state"], registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield port, slots
    finally:
        server.shutdown()
        thread.join(timeout=5)


def probe(port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMNISERVE_WORKER_METRICS_PORT": str(port)}
    return subprocess.run(
        [sys.executable, str(DEPLOY / "probes" / "worker_ready.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_worker_readiness_follows_the_slots(worker_metrics: Any) -> None:
    port, slots = worker_metrics
    assert probe(port).returncode == 1  # no slot yet
    slots.labels("w1#1", "loading").set(1)
    assert probe(port).returncode == 1  # model still loading
    slots.labels("w1#1", "loading").set(0)
    slots.labels("w1#1", "idle").set(1)
    assert probe(port).returncode == 0
    slots.labels("w1#1", "idle").set(0)
    slots.labels("w1#1", "busy").set(1)
    assert probe(port).returncode == 0  # busy is still serving
    assert probe(free_port()).returncode == 1  # nothing listening
