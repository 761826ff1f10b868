"""deploy/tls/nginx.conf run by a real nginx (Debian's build) on loopback.

Only what cannot work on this machine is changed: listen ports, the upstream addresses, a test
certificate, log files instead of stdout/stderr, and nginx's pid and temp paths. Each change is
asserted to apply, so an edited config cannot silently escape the test.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import websockets

from omniserve.redis_server import free_port
from tests.support.client import Client
from tests.support.deploy_tools import DEPLOY, nginx, run
from tests.support.stack import Stack

CONF = DEPLOY / "tls" / "nginx.conf"
KEY, BEARER = "query-key-SECRET-0123", "header-key-SECRET-4567"


@dataclass
class Proxy:
    """A running nginx with this config."""

    https: int
    http: int
    access: Path
    error: Path

    def logs(self) -> str:
        return self.access.read_text() + self.error.read_text()


def render(tmp: Path, http: int, https: int, upstream: int, error_level: str | None = None) -> Path:
    """The config with this machine's ports, certificate and log files."""
    text = CONF.read_text()

    def sub(pattern: str, repl: str) -> None:
        nonlocal text
        text, n = re.subn(pattern, repl, text)
        assert n, f"nginx.conf no longer has {pattern!r}"

    cert, key = tmp / "cert.pem", tmp / "key.pem"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    made = run([*openssl, "-subj", "/CN=omni.example.com", "-keyout", str(key), "-out", str(cert)])
    assert made.returncode == 0, made.stderr
    sub(r"listen 80;", f"listen 127.0.0.1:{http};")
    sub(r"listen 443 ssl;", f"listen 127.0.0.1:{https} ssl;")
    sub(r"server gateway-\d\.internal:8006", f"server 127.0.0.1:{upstream}")
    sub(r"/etc/nginx/tls/fullchain\.pem", str(cert))
    sub(r"/etc/nginx/tls/privkey\.pem", str(key))
    sub(r"access_log /dev/stdout", f"access_log {tmp}/access.log")
    sub(r"error_log /dev/stderr", f"error_log {tmp}/error.log")
    if error_level:
        sub(r"(error_log \S+) crit;", rf"\1 {error_level};")
    temp = "".join(
        f"    {kind}_temp_path {tmp}/{kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    sub(r"http \{\n", "http {\n" + temp)
    conf = tmp / "nginx.conf"
    conf.write_text(f"pid {tmp}/nginx.pid;\n" + text)
    return conf


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen[bytes]] = []

    def start(upstream: int, error_level: str | None = None) -> Proxy:
        tmp = tmp_path / f"nginx{len(procs)}"
        tmp.mkdir()
        http, https = free_port(), free_port()
        conf = render(tmp, http, https, upstream, error_level)
        checked = run([str(nginx()), "-t", "-p", str(tmp), "-c", str(conf)])
        assert checked.returncode == 0, checked.stderr
        proc = subprocess.Popen(
            [str(nginx()), "-p", str(tmp), "-c", str(conf), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(proc)
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                socket.create_connection(("127.0.0.1", https), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not listen"
                time.sleep(0.05)
        return Proxy(https, http, tmp / "access.log", tmp / "error.log")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def tls() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the test's self-signed certificate
    return ctx


async def wait_for_log(proxy: Proxy, needle: str) -> str:
    """nginx writes the access-log line when the request ends: poll for it."""
    deadline = time.monotonic() + 20
    while needle not in proxy.access.read_text():
        assert time.monotonic() < deadline, proxy.access.read_text()
        await asyncio.sleep(0.05)
    return proxy.logs()


def test_config_keeps_its_promises_on_paper() -> None:
    text = CONF.read_text()
    fmt = re.search(r"log_format omniserve_redacted(.*?);", text, re.S)
    assert fmt, "the redacted log format is gone"
    for var in ("$request ", '$request"', "$request_uri", "$args", "$query_string", "$arg_api_key"):
        assert var not in fmt.group(1), var
    ws = re.search(r"location ~ \^/\(v1/realtime\|ws/chat\)\$ \{(.*?)\}", text, re.S)
    assert ws
    for timeout in ("proxy_read_timeout", "proxy_send_timeout"):
        (value,) = re.findall(rf"{timeout} (\d+)s;", ws.group(1))
        assert int(value) > 600  # longer than the longest session
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in ws.group(1)
    assert re.search(r"error_log \S+ crit;", text)


async def test_websocket_is_proxied_with_trusted_headers_and_no_key_in_logs(start_proxy) -> None:
    seen: list[tuple[str, dict[str, str]]] = []

    async def echo(ws: websockets.ServerConnection) -> None:
        seen.append((ws.request.path, {k.lower(): v for k, v in ws.request.headers.raw_items()}))
        async for msg in ws:
            await ws.send(msg)

    upstream_port = free_port()
    async with websockets.serve(echo, "127.0.0.1", upstream_port):
        proxy = start_proxy(upstream_port)
        url = f"wss://127.0.0.1:{proxy.https}/v1/realtime?mode=audio&api_key={KEY}"
        headers = {
            "Authorization": f"Bearer {BEARER}",
            "X-Forwarded-For": "203.0.113.9",  # a client lying about its address
        }
        async with websockets.connect(
            url, ssl=tls(), additional_headers=headers, origin="https://omni.example.com"
        ) as ws:
            await ws.send("hello")
            assert await asyncio.wait_for(ws.recv(), 10) == "hello"
    ((path, got),) = seen
    assert path == f"/v1/realtime?mode=audio&api_key={KEY}"  # the gateway still gets the key
    assert got["x-forwarded-for"] == "127.0.0.1"  # the real peer, not the client's claim
    assert got["x-forwarded-proto"] == "https"
    assert got["authorization"] == f"Bearer {BEARER}"
    assert got["origin"] == "https://omni.example.com"
    logs = await wait_for_log(proxy, '"GET /v1/realtime HTTP/1.1" mode=audio 101')
    assert KEY not in logs and BEARER not in logs and "api_key" not in logs


async def test_failed_upstream_keeps_the_key_out_of_the_error_log(start_proxy) -> None:
    dead = free_port()  # nothing listens there
    url = "/v1/realtime?mode=chat&api_key=" + KEY
    proxy = start_proxy(dead)
    async with httpx.AsyncClient(verify=False) as client:
        resp = await client.get(f"https://127.0.0.1:{proxy.https}{url}")
    assert resp.status_code == 502
    logs = await wait_for_log(proxy, '"GET /v1/realtime HTTP/1.1" mode=chat 502')
    assert KEY not in logs
    # Control: at level "error" nginx does quote the request line, which is why the config
    # keeps the error log at "crit".
    loud = start_proxy(dead, error_level="error")
    async with httpx.AsyncClient(verify=False) as client:
        await client.get(f"https://127.0.0.1:{loud.https}{url}")
    await wait_for_log(loud, "mode=chat 502")
    assert KEY in loud.error.read_text()


async def test_plain_http_redirects_and_internal_paths_are_not_proxied(start_proxy) -> None:
    proxy = start_proxy(free_port())
    async with httpx.AsyncClient(verify=False) as client:
        resp = await client.get(f"http://127.0.0.1:{proxy.http}/v1/realtime?api_key={KEY}")
        assert resp.status_code == 301
        assert resp.headers["location"].startswith("https://")
        for path in ("/metrics", "/v1/workers", "/v1/recordings", "/health"):
            assert (await client.get(f"https://127.0.0.1:{proxy.https}{path}")).status_code == 404
    assert KEY not in proxy.logs()


async def test_a_real_session_through_the_proxy(start_proxy, service: Stack) -> None:
    """The omniserve gateway behind this nginx: a chat turn over wss:// streams its answer."""
    proxy = start_proxy(service.gateways[0][1])
    client = await Client.connect(f"wss://127.0.0.1:{proxy.https}", query="?mode=chat", ssl=tls())
    try:
        created = await client.init()
        assert created["session_id"].startswith("rt_")
        content = "Reply with exactly: through the proxy"
        await client.send(
            {
                "type": "input.append",
                "input": {"messages": [{"role": "user", "content": content}], "streaming": True},
            }
        )
        done = await client.until("response.done")
        assert done["text"] == "through the proxy"
    finally:
        await client.close()
    await wait_for_log(proxy, '"GET /v1/realtime HTTP/1.1" mode=chat 101')
