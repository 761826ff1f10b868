"""What a client's keys, logs, the admin token, origins and per-client limits do against real
gateway processes.

Each rule is tried with a good and a bad request on loopback. A ``mode=chat`` connection that is
let in gets ``session.queue_done`` at once (it holds no worker slot until a turn), so most of
these need no worker. The voices directory and the Celery task arguments are in
tests/e2e/test_security_data.py.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from omniserve.redis_server import free_port, redis_binary
from tests.support.client import Client
from tests.support.stack import ROOT, Stack

pytestmark = pytest.mark.asyncio


async def attempt(
    url: str, query: str = "?mode=chat", path: str = "/v1/realtime", **kwargs: Any
) -> tuple[dict[str, Any], Client]:
    """Connect and read the first frame: ``session.queue_done`` when let in, else the refusal."""
    c = await Client.connect(url, path=path, query=query, **kwargs)
    return await c.recv(timeout=20), c


async def refused(
    url: str, code: str, close: int, query: str = "?mode=chat", **kwargs: Any
) -> dict[str, Any]:
    """Assert a connection is refused with ``error {code}`` and close code ``close``."""
    frame, c = await attempt(url, query=query, **kwargs)
    assert frame["type"] == "error" and frame["error"]["code"] == code, frame
    assert frame["error"]["type"] == "client_error"
    assert await c.closed() == close
    return frame


async def admitted(url: str, query: str = "?mode=chat", **kwargs: Any) -> Client:
    """Assert a connection is let in; returns it open."""
    frame, c = await attempt(url, query=query, **kwargs)
    assert frame["type"] == "session.queue_done", frame
    return c


def bearer(token: str) -> dict[str, Any]:
    return {"additional_headers": {"Authorization": f"Bearer {token}"}}


# --------------------------------------------------------------------------- API keys


async def test_api_key_as_bearer_or_query_else_unauthorized(stack: Stack) -> None:
    key = f"sk-{uuid.uuid4().hex}"
    stack.start_gateway(OMNISERVE_API_KEYS=f'["other-key-0000", "{key}"]')
    url = stack.url()
    good = [
        await admitted(url, **bearer(key)),
        await admitted(url, query=f"?mode=chat&api_key={key}"),
    ]
    await refused(url, "unauthorized", 1008)  # no key
    await refused(url, "unauthorized", 1008, **bearer("nope"))
    await refused(url, "unauthorized", 1008, query=f"?mode=chat&api_key={key[:-1]}")
    await refused(url, "unauthorized", 1008, additional_headers={"Authorization": f"Basic {key}"})
    # a bad key is refused before the mode is even looked at
    await refused(url, "unauthorized", 1008, query="?mode=nonsense")
    # /ws/chat: the same keys, its own error shape
    frame, legacy = await attempt(url, path="/ws/chat", query="?api_key=wrong")
    assert frame == {"type": "error", "error": "missing or invalid API key"}
    assert await legacy.closed() == 1008
    for c in good:
        await c.close()
    # nothing refused ever took a ticket
    assert stack.redis().zcard(stack.keys.queue) == 0


# --------------------------------------------------------------------------- secrets in logs


@pytest.fixture
def password_redis() -> Iterator[str]:
    """A private redis-server with ``requirepass`` (the deploy files' setup)."""
    password = f"redispw{uuid.uuid4().hex}"
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="guard-redis-")
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir]
    proc = subprocess.Popen(
        [redis_binary(), *args, "--requirepass", password],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis.from_url(url, socket_timeout=1).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


async def test_keys_and_redis_password_never_reach_the_logs(password_redis: str) -> None:
    """Run a real gateway and worker, send keys every way a client can, grep their whole output
    (uvicorn's lines, the access log, Celery's) for the key and the Redis password."""
    key = f"sk-{uuid.uuid4().hex}"
    wrong = f"wrong{uuid.uuid4().hex}"
    admin = f"adm{uuid.uuid4().hex}"
    password = password_redis.split(":")[2].split("@")[0]
    stack = Stack(password_redis)
    try:
        stack.start_worker()
        stack.start_gateway(OMNISERVE_API_KEYS=f'["{key}"]', OMNISERVE_ADMIN_TOKEN=admin)
        url = stack.url()
        c = await admitted(url, query=f"?mode=chat&api_key={key}")
        await c.send({"type": "session.init", "payload": {}})
        await c.until("session.created")
        await c.send(
            {
                "type": "input.append",
                "input": {"messages": [{"role": "user", "content": "Reply with exactly: ok"}]},
            }
        )
        assert (await c.until("response.done"))["text"] == "ok"
        await c.close()
        await (await admitted(url, query=f"?api_key={key}&mode=chat", **bearer(key))).close()
        await refused(url, "unauthorized", 1008, query=f"?mode=chat&api_key={wrong}")
        await refused(url, "unauthorized", 1008, query=f"?mode=chat&apikey={key}")
        frame, legacy = await attempt(url, path="/ws/chat", query=f"?api_key={wrong}")
        assert frame["error"] == "missing or invalid API key"
        await legacy.closed()
        async with httpx.AsyncClient() as http:
            base = f"http://127.0.0.1:{stack.gateways[0][1]}"
            r = await http.get(f"{base}/metrics?token={admin}")
            assert r.status_code == 401
            r = await http.get(f"{base}/metrics", headers={"Authorization": f"Bearer {admin}"})
            assert r.status_code == 200
            r = await http.get(f"{base}/v1/{key}")  # a key in the path of a 404
            assert r.status_code == 404
    finally:
        stack.stop()  # the processes flush and exit: their logs are complete
    gateway_log = stack.gateways[0][0].log.read_text(errors="replace")
    worker_log = stack.workers[0].log.read_text(errors="replace")
    for text in (gateway_log, worker_log):
        for secret in (key, wrong, admin, password):
            assert secret not in text
    # the lines are there, without their secrets: the assertions above are not vacuous
    assert '"WebSocket /v1/realtime?mode=chat" 101' in gateway_log
    assert '"WebSocket /ws/chat"' in gateway_log
    assert '"GET /metrics" 401' in gateway_log and '"GET /metrics" 200' in gateway_log
    assert '"GET /v1/***" 404' in gateway_log
    assert "redis://:***@127.0.0.1" in gateway_log


# --------------------------------------------------------------------------- admin endpoints


ADMIN_PATHS = (
    "/metrics",
    "/v1/workers",
    "/v1/admin/overview",
    "/v1/admin/keys",
    "/v1/admin/usage",
    "/v1/recordings/x",
)


async def status_codes(port: int, headers: dict[str, str] | None = None) -> set[int]:
    async with httpx.AsyncClient() as http:
        codes = set()
        for path in ADMIN_PATHS:
            r = await http.get(f"http://127.0.0.1:{port}{path}", headers=headers or {})
            codes.add(404 if path.endswith("/x") and r.status_code == 404 else r.status_code)
        return codes


async def test_admin_token_guards_metrics_workers_and_admin(stack: Stack) -> None:
    token = f"adm-{uuid.uuid4().hex}"
    port = stack.start_gateway(OMNISERVE_ADMIN_TOKEN=token)
    assert await status_codes(port) == {401}
    assert await status_codes(port, {"Authorization": "Bearer wrong"}) == {401}
    assert await status_codes(port, {"Authorization": token}) == {401}
    assert await status_codes(port, {"Authorization": f"Bearer {token}"}) == {200, 404}
    async with httpx.AsyncClient() as http:
        ok = await http.get(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        assert "omniserve_queue_waiting" in ok.text
        for public in ("/health", "/", "/ops", "/web/config", "/web/protocol.js", "/v1/protocol"):
            assert (await http.get(f"http://127.0.0.1:{port}{public}")).status_code == 200


async def test_without_admin_token_open_on_loopback_refused_elsewhere(stack: Stack) -> None:
    loopback = stack.start_gateway()
    assert await status_codes(loopback) == {200, 404}
    public = stack.start_gateway(OMNISERVE_GATEWAY_HOST="0.0.0.0")  # reached here on loopback
    assert await status_codes(public) == {403}
    async with httpx.AsyncClient() as http:
        r = await http.get(f"http://127.0.0.1:{public}/metrics")
        assert "OMNISERVE_ADMIN_TOKEN" in r.json()["detail"]
    local_log = stack.gateways[0][0].log.read_text()
    public_log = stack.gateways[1][0].log.read_text()
    assert "WARNING OMNISERVE_ADMIN_TOKEN is not set" in local_log and "open to" in local_log
    assert "WARNING OMNISERVE_ADMIN_TOKEN is not set" in public_log and "403" in public_log
    assert "WARNING OMNISERVE_API_KEYS is empty" in public_log


# --------------------------------------------------------------------------- origins


async def test_browser_origins(stack: Stack) -> None:
    port = stack.start_gateway(OMNISERVE_ALLOWED_ORIGINS='["https://app.example"]')
    url = stack.url()
    good = [
        await admitted(url),  # no Origin: not a browser
        await admitted(url, origin="https://app.example"),
        await admitted(url, origin=f"http://127.0.0.1:{port}"),  # the gateway's own web page
    ]
    frame = await refused(url, "origin_not_allowed", 1008, origin="https://evil.example")
    assert frame["error"]["message"] == "origin not allowed"
    await refused(url, "origin_not_allowed", 1008, origin="http://app.example")
    await refused(url, "origin_not_allowed", 1008, query="?mode=audio", origin="null")
    frame, legacy = await attempt(url, path="/ws/chat", query="", origin="https://evil.example")
    assert frame == {"type": "error", "error": "origin not allowed"}
    assert await legacy.closed() == 1008
    for c in good:
        await c.close()


# --------------------------------------------------------------------------- per-client limits


async def test_connections_per_address_across_gateways(stack: Stack) -> None:
    limits = {"OMNISERVE_MAX_CONNECTIONS_PER_CLIENT": "2"}
    stack.start_gateway(**limits)
    stack.start_gateway(**limits)
    first = await admitted(stack.url(0))
    second = await admitted(stack.url(1), query="?x=1&mode=chat")
    for i in (0, 1):
        frame = await refused(stack.url(i), "too_many_connections", 1013)
        assert "at most 2" in frame["error"]["message"]
    frame, legacy = await attempt(stack.url(0), path="/ws/chat", query="")
    assert frame["error"].startswith("too many connections")
    assert await legacy.closed() == 1013
    await first.close()
    third = await wait_admitted(stack.url(1))  # a closed connection frees its place
    await refused(stack.url(0), "too_many_connections", 1013)
    await second.close()
    await third.close()


async def wait_admitted(url: str, timeout: float = 30, **kwargs: Any) -> Client:
    """Connect until let in (a count is released asynchronously when a connection ends)."""
    deadline = time.monotonic() + timeout
    while True:
        frame, c = await attempt(url, **kwargs)
        if frame["type"] == "session.queue_done":
            return c
        assert frame["error"]["code"] == "too_many_connections", frame
        assert time.monotonic() < deadline, "the address's count was never released"
        await c.closed()
        await asyncio.sleep(0.2)


def forwarded(address: str) -> dict[str, Any]:
    return {"additional_headers": {"X-Forwarded-For": address}}


async def test_forwarded_for_only_from_trusted_proxies(stack: Stack) -> None:
    limits = {"OMNISERVE_MAX_CONNECTIONS_PER_CLIENT": "1"}
    stack.start_gateway(OMNISERVE_TRUSTED_PROXIES='["127.0.0.0/8"]', **limits)  # behind a proxy
    stack.start_gateway(**limits)  # facing clients: X-Forwarded-For is a client's claim
    proxied, direct = stack.url(0), stack.url(1)
    held = [
        await admitted(proxied, **forwarded("203.0.113.1")),
        await admitted(proxied, **forwarded("203.0.113.2")),
        # what the client claims left of what the proxy appended is not believed
        await admitted(proxied, **forwarded("198.51.100.9, 203.0.113.3")),
    ]
    await refused(proxied, "too_many_connections", 1013, **forwarded("203.0.113.1"))
    await refused(proxied, "too_many_connections", 1013, **forwarded("10.9.9.9, 203.0.113.3"))
    # the direct gateway counts the peer (127.0.0.1), whatever the header says
    held.append(await admitted(direct, **forwarded("192.0.2.1")))
    await refused(direct, "too_many_connections", 1013, **forwarded("192.0.2.2"))
    await refused(direct, "too_many_connections", 1013)
    for c in held:
        await c.close()


async def test_a_killed_gateway_does_not_keep_its_count(stack: Stack) -> None:
    env = {"OMNISERVE_MAX_CONNECTIONS_PER_CLIENT": "1", "OMNISERVE_GATEWAY_LEASE_TTL_S": "2"}
    stack.start_gateway(**env)
    stack.start_gateway(**env)
    held = await admitted(stack.url(0))
    await refused(stack.url(1), "too_many_connections", 1013)
    stack.gateways[0][0].stop(signal.SIGKILL)
    await held.closed()
    c = await wait_admitted(stack.url(1))  # once gateway 0's alive key lapsed
    await c.close()


async def test_probe_sends_its_key_as_a_bearer_header(stack: Stack) -> None:
    key = f"sk-{uuid.uuid4().hex}"
    stack.start_worker()
    stack.start_gateway(OMNISERVE_API_KEYS=f'["{key}"]')

    def probe(*extra: str) -> subprocess.CompletedProcess[str]:
        command = ["probe", "--url", stack.url(), *extra, "chat", "Reply with exactly: keyed"]
        return subprocess.run(
            [sys.executable, "-m", "omniserve", *command],
            env=stack.base_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = await asyncio.to_thread(probe, "--api-key", key)
    assert ok.returncode == 0 and "keyed" in ok.stdout, ok.stderr
    refused = await asyncio.to_thread(probe)
    assert refused.returncode != 0 and "unauthorized" in refused.stderr
    assert "Traceback" not in refused.stderr  # one line: omniserve probe: unauthorized: ...
