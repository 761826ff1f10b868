"""Reading a real /metrics endpoint the way Prometheus does (its own text parser), and a
scripted worker that serves one; for the tests that watch a running gateway's or worker's
metrics move."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from omniserve.redis_server import free_port
from tests.support.stack import Stack


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value of a /metrics endpoint, through the real parser."""
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **lab: str
) -> float:
    """Sum of the samples called ``name`` whose labels include ``lab``."""
    want = set(lab.items())
    return sum(v for (n, labels), v in samples.items() if n == name and want <= set(labels))


async def wait_for(url: str, ok: Callable[[Any], bool], timeout: float = 15.0) -> Any:
    """Scrape until ``ok(samples)`` (the handler's last lines run after the client saw the end)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = await asyncio.to_thread(scrape, url)
        if ok(samples) or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.1)


def worker_metrics_url(stack: Stack) -> str:
    """Start a scripted worker whose /metrics listens on a free port; its URL."""
    port = free_port()
    stack.start_worker(
        OMNISERVE_WORKER_METRICS_PORT=str(port), OMNISERVE_WORKER_METRICS_HOST="127.0.0.1"
    )
    return f"http://127.0.0.1:{port}/metrics"
