"""Readiness probe of a worker container: exit 0 once the worker's model is loaded.

Reads the worker's own Prometheus endpoint (port ``OMNISERVE_WORKER_METRICS_PORT``, default 9108)
and checks ``omniserve_worker_slots``: at least one slot idle or busy, none loading. Kubernetes
runs it in the worker image (``python /app/worker_ready.py``); a rolling update replaces the next
worker only when the new one is ready, so the fleet never loses two GPUs' worth of slots at once.
It reads the port the way the worker does, from the environment, because it runs in the worker's
container outside the omniserve process.
"""

from __future__ import annotations

import os
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

SLOTS = "omniserve_worker_slots"


def slot_counts(metrics_text: str) -> dict[str, float]:
    """Slots by state (idle, busy, loading) summed over the worker's processes."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != SLOTS:
            continue
        for sample in family.samples:
            state = sample.labels.get("state", "")
            counts[state] = counts.get(state, 0.0) + sample.value
    return counts


def is_ready(counts: dict[str, float]) -> bool:
    """Ready: some slot can take (or is running) a session, and no model is still loading."""
    serving = counts.get("idle", 0.0) + counts.get("busy", 0.0)
    return serving > 0 and counts.get("loading", 0.0) == 0


def main() -> int:
    port = int(os.environ.get("OMNISERVE_WORKER_METRICS_PORT", "9108"))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as resp:
            text = resp.read().decode("utf-8")
    except OSError as exc:
        print(f"not ready: metrics endpoint: {exc}", file=sys.stderr)
        return 1
    counts = slot_counts(text)
    if not is_ready(counts):
        print(f"not ready: {SLOTS} {counts or 'absent'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
