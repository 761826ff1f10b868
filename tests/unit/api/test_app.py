"""``api.app.create_app``: the lifespan starts the gateway on Redis (its lease, its connection
counts) and ends it, and every feature's routes are included. Run in process by Starlette's
TestClient against the run's Redis (``tests/support/in_process_gateway.py``)."""

from __future__ import annotations

import pytest

from tests.support.in_process_gateway import in_process_gateway

pytestmark = pytest.mark.timeout(30)


def test_the_lifespan_takes_the_gateways_lease_and_gives_it_back(redis_server: str) -> None:
    with in_process_gateway(redis_server) as gw:
        gateway = gw.client.app.state.gateway
        alive = gw.keys.gateway_alive(gateway.gateway_id)
        assert gw.redis.exists(alive)  # taken in the lifespan, before the first request
        assert gw.client.get("/healthz").json()["gateway_id"] == gateway.gateway_id
        redis = gw.redis
    assert not redis.exists(alive)  # given back when the lifespan ended


def test_every_features_routes_are_included(redis_server: str) -> None:
    """Health, admin, recordings and pages answer (the WebSocket routes:
    tests/unit/api/realtime/test_routes.py)."""
    paths = ["/healthz", "/readyz", "/health", "/metrics", "/v1/workers", "/v1/recordings", "/"]
    with in_process_gateway(redis_server) as gw:
        answers = {path: gw.client.get(path).status_code for path in paths}
    assert answers == {**dict.fromkeys(paths, 200), "/readyz": 503}  # (no worker: not ready)
