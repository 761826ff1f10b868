"""api/ops/pages.py: the protocol's names are served to any client and to the web client."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.ops.pages import create_router
from api.protocol.catalog import catalog, javascript_module
from omnicore.settings import Settings


def _client() -> TestClient:
    app = FastAPI()
    app.include_router(create_router(Settings()))
    return TestClient(app)


def test_protocol_as_json() -> None:
    r = _client().get("/v1/protocol")
    assert r.status_code == 200
    assert r.json() == catalog()
    assert r.json()["ErrorCode"]["QUEUE_FULL"] == "queue_full"


def test_protocol_as_a_javascript_module() -> None:
    r = _client().get("/web/protocol.js")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/javascript")
    assert r.text == javascript_module()
    assert r.headers["cache-control"] == "no-cache"  # a newer gateway's names are seen at once
