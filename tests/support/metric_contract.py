"""The metric contract, deploy/dashboards/metric_names.txt, read and checked line by line: the
dashboard tests and the metrics tests hold the code and the dashboards to it."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.deploy_tools import DEPLOY

METRIC_NAMES = DEPLOY / "dashboards" / "metric_names.txt"


@dataclass(frozen=True)
class Metric:
    name: str
    type: str
    labels: frozenset[str]
    process: str  # "gateway", "worker" or "gateway,worker"


def contract() -> dict[str, Metric]:
    """Each line of the contract by its metric name; a malformed line fails the test reading it."""
    metrics = {}
    for line in METRIC_NAMES.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, kind, labels, process = line.split()
        assert name.startswith("omniserve_"), name
        assert kind in {"counter", "gauge", "histogram"}, line
        assert (kind == "counter") == name.endswith("_total"), line
        assert set(process.split(",")) <= {"gateway", "worker"}, line
        assert name not in metrics, f"{name} twice"
        metrics[name] = Metric(
            name, kind, frozenset() if labels == "-" else frozenset(labels.split(",")), process
        )
    return metrics


def of_process(process: str) -> dict[str, Metric]:
    """The contract's metrics that ``process`` ("gateway" or "worker") serves."""
    return {n: m for n, m in contract().items() if process in m.process.split(",")}


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
