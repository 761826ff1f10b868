"""The real gateway app (``api.app.create_app``) served in the test's own process by Starlette's
``TestClient``: its lifespan runs as under uvicorn (the gateway's lease, output bus, queue
manager, liveness ticks, client connection counts), against the run's private Redis under a key
prefix of its own. Clients are ``TestClient`` WebSockets and HTTP requests.

No uvicorn and no worker process: for the protocol paths a client takes before a worker is
needed (refusals, validation, the queue), without starting a process. One difference from
uvicorn: when a test leaves ``websocket_connect``'s block, TestClient cancels the handler right
after the client's close, so what a handler does after its client has gone (a connection count
given back, a session's end) is left to the paths a cancellation takes; the e2e tests see those
as a client sees them. A worker that has
registered but is still loading its model is written to the registry as a real worker writes
it (``loading_worker``), so that clients queue for it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketTestSession

from api.app import create_app
from omnicore.settings import Settings
from streaming.keys import Keys
from streaming.slots import WorkerRegistry


@dataclass
class InProcessGateway:
    """A running app: its HTTP and WebSocket client, and its Redis namespace."""

    client: TestClient
    keys: Keys
    redis: redis.Redis

    def loading_worker(self, slots: int = 1) -> WorkerRegistry:
        """A worker registered with ``slots`` slots, its model still loading: coming capacity,
        so a duplex client is queued (``session.queued``) rather than refused."""
        reg = WorkerRegistry(self.redis, self.keys, f"loading-{uuid.uuid4().hex[:6]}", 60.0)
        reg.register({"slots": slots, "state": "loading", "loading_since": time.time()})
        return reg


@contextmanager
def in_process_gateway(redis_url: str, **settings: Any) -> Iterator[InProcessGateway]:
    """The app built from ``Settings(**settings)`` on ``redis_url``, its lifespan started; on
    exit the lifespan ends (the gateway drains and stops) and the namespace's keys go."""
    prefix = "ip" + uuid.uuid4().hex[:8]
    app = create_app(Settings(redis_url=redis_url, key_prefix=prefix, **settings))
    sync = redis.Redis.from_url(redis_url)
    try:
        with TestClient(app) as client:
            yield InProcessGateway(client, Keys(prefix), sync)
    finally:
        stale = list(sync.scan_iter(f"{prefix}:*", count=1000))
        if stale:
            sync.delete(*stale)
        sync.close()


def until(ws: WebSocketTestSession, kind: str, limit: int = 50) -> dict[str, Any]:
    """The next server event of type ``kind`` (the events before it are skipped)."""
    for _ in range(limit):
        event: dict[str, Any] = ws.receive_json()
        if event["type"] == kind:
            return event
    raise AssertionError(f"no {kind} in {limit} events")


def close_code(ws: WebSocketTestSession, limit: int = 50) -> int:
    """The code the server closes the socket with (the events before it are skipped)."""
    for _ in range(limit):
        message = ws.receive()
        if message["type"] == "websocket.close":
            return int(message.get("code", 1000))
    raise AssertionError(f"the socket stayed open for {limit} messages")
