"""A pytest plugin that points the official demo's own gateway tests at a running omniserve.

The demo's ``tests/test_integration.py`` and ``tests/test_e2e.py`` start its gateway
(``gateway.py``) with mock or model workers and then speak HTTP and WebSocket to it. Loaded with
``-p official_suite`` (this directory on ``PYTHONPATH``), the plugin starts none of their
processes: their clusters wait for the omniserve gateway at ``OMNISERVE_URL`` to show the slots
the test asks for, and every request goes there. Their test code runs unchanged. How to run it:
docs/FRONTEND.md, "The official demo's own tests against omniserve".
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

import pytest


def _url() -> str:
    return os.environ["OMNISERVE_URL"].rstrip("/")


def _module(name: str) -> ModuleType | None:
    return sys.modules.get(f"tests.{name}") or sys.modules.get(name)


def _point_integration_clusters(mod: Any, url: str) -> None:
    cluster = mod.ServiceCluster

    async def start(self: Any) -> None:
        ok = await mod.wait_for_gateway_workers_ready(url, self.num_workers, timeout=30)
        assert ok, f"omniserve at {url} does not show {self.num_workers} idle slots"

    cluster.start = start
    cluster.stop = lambda self: None
    cluster.gateway_url = property(lambda self: url)
    cluster.gateway_ws_url = property(lambda self: url.replace("http", "ws", 1))


def _point_e2e_gateways(mod: Any, url: str) -> None:
    """Its fixtures use ports base, base+1, base+2 for 1, 2 and 3 workers: the base is set so
    that the fixture named by ``E2E_FIXTURE_OFFSET`` (0, 1 or 2) reaches omniserve."""
    port = int(url.rsplit(":", 1)[1])
    mod.E2E_GATEWAY_PORT = port - int(os.environ.get("E2E_FIXTURE_OFFSET", "0"))
    manager = mod.E2EProcessManager
    manager.start_real_worker = lambda self, *a, **k: None
    manager.start_gateway = lambda self, *a, **k: None
    manager.kill_gateways = lambda self: None
    manager.kill_all = lambda self: None

    async def healthy(url: str, timeout: float = 0) -> bool:
        return True

    mod.wait_for_health = healthy


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    url = _url()
    if (integration := _module("test_integration")) is not None:
        _point_integration_clusters(integration, url)
    if (e2e := _module("test_e2e")) is not None:
        _point_e2e_gateways(e2e, url)
