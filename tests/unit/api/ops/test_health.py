"""``/healthz``, ``/readyz`` and ``/health`` of the real app in process (its lifespan run by
Starlette's TestClient, ``tests/support/in_process_gateway.py``) on the run's Redis: what each
says with no worker, with a worker still loading its model, and while the gateway drains."""

from __future__ import annotations

import pytest

from tests.support.in_process_gateway import in_process_gateway

pytestmark = pytest.mark.timeout(30)


def test_with_no_worker_the_gateway_is_alive_not_ready_and_says_why(redis_server: str) -> None:
    with in_process_gateway(redis_server) as gw:
        live = gw.client.get("/healthz")
        assert live.status_code == 200 and live.json()["status"] == "alive"
        ready = gw.client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {
            "ready": False,
            "redis": True,
            "redis_writable": True,
            "live_slots": 0,
            "draining": False,
            "at_connection_limit": False,
        }
        health = gw.client.get("/health")
        assert health.status_code == 200  # Redis answers and takes writes
        body = health.json()
        assert (body["status"], body["worker_slots"], body["loading_slots"]) == ("degraded", 0, 0)
        assert body["gateway_id"] == live.json()["gateway_id"]
        assert body["queue_length"] == 0 and body["sessions"] == 0
        assert body["broker"] == "redis://" + redis_server.split("://")[1].split("/")[0]


def test_a_worker_loading_its_model_makes_the_health_loading(redis_server: str) -> None:
    with in_process_gateway(redis_server) as gw:
        gw.loading_worker(slots=2)
        body = gw.client.get("/health").json()
        assert (body["status"], body["worker_slots"], body["loading_slots"]) == ("loading", 0, 2)


def test_a_draining_gateway_is_not_ready(redis_server: str) -> None:
    with in_process_gateway(redis_server) as gw:
        gw.client.app.state.gateway.shutting_down = True  # what SIGTERM's drain sets first
        ready = gw.client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["draining"] is True
