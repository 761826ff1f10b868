"""``omniserve probe`` tells what went wrong in one line, never as a traceback (a newcomer's first
command after ``up``; the gateway's own refusals are in tests/e2e/test_security_access.py). The
command's ``main`` runs in process: an exception it let out would fail the test as it is."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from omniserve.cli import main
from omniserve.redis_server import free_port
from tests.support.in_process_cli import Ran, run_main


def probe(*args: str, **env: str) -> Ran:
    return run_main(main, ["probe", *args], **env)


def one_line_failure(done: Ran) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("omniserve probe: "), done.stderr
    return lines[0]


def test_nothing_listening_and_the_url_up_prints() -> None:
    """``up`` prints the gateway as http://...: probe takes it as the ws:// URL it is."""
    port = free_port()
    said = one_line_failure(probe("--url", f"http://127.0.0.1:{port}/", "chat", "hi"))
    assert f"nothing answers at ws://127.0.0.1:{port}: is the gateway running there" in said


def test_without_url_it_tries_the_gateway_the_settings_name() -> None:
    """The gateway ``up`` and ``gateway`` start in the same environment (any-address binds are
    reached on loopback)."""
    port = free_port()
    env = {"OMNISERVE_GATEWAY_HOST": "0.0.0.0", "OMNISERVE_GATEWAY_PORT": str(port)}
    said = one_line_failure(probe("chat", "hi", **env))
    assert f"nothing answers at ws://127.0.0.1:{port}: is the gateway running there" in said


def test_a_missing_input_file() -> None:
    said = one_line_failure(probe("audio", "/nonexistent/question.wav", "/tmp/answer.wav"))
    assert said.endswith("/nonexistent/question.wav: no such file")


def test_not_a_websocket_url() -> None:
    said = one_line_failure(probe("--url", "ftp://127.0.0.1:1", "chat", "hi"))
    assert "ftp://127.0.0.1:1 is not a gateway URL: use ws://host:port" in said


@pytest.fixture
def plain_http_server() -> Iterator[int]:
    """Something else on the port: an HTTP server that answers every request with a page."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"hi")

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_something_else_on_the_port(plain_http_server: int) -> None:
    said = one_line_failure(probe("--url", f"ws://127.0.0.1:{plain_http_server}", "chat", "hi"))
    assert f"what answers at ws://127.0.0.1:{plain_http_server} is not a gateway" in said
