"""The official demo's own pages, unchanged, in headless Chromium against omniserve.

The demo's frontend is not part of this repository: point ``OMNISERVE_TEST_OFFICIAL_DEMO`` at a
checkout of ``OpenBMB/MiniCPM-o-Demo`` (branch ``realtime-protocol``; its ``static/``,
``assets/presets`` and ``assets/ref_audio`` are used). Without it, or without Debian's chromium,
the tests skip.

A real gateway serves the demo's ``static/`` (``OMNISERVE_STATIC_DIR``) with a scripted worker
that speaks on every step (one slot, so a second user queues). The pages run as a user would run
them; the tests watch their network calls and WebSocket frames:

- every page loads with no failed call (no 4xx/5xx) and no console error;
- a second user who starts while the only slot is busy waits and is served once the first
  leaves (the page sends ``session.update`` while queued);
- an omni session through a proxy that delays traffic at random (network jitter) sees no
  ``error`` frame, and its ``client_diagnostic`` gap reports reach the counter.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.browser]

DEMO = os.environ.get("OMNISERVE_TEST_OFFICIAL_DEMO")
CHROMIUM = Path("/usr/bin/chromium")
PAGES = ["/", "/turnbased", "/omni", "/audio_duplex", "/realtime", "/admin"]
JITTER_S = 1.5
TIMEOUT_MS = 60_000

if not DEMO or not (Path(DEMO) / "static" / "omni" / "omni.html").is_file():
    pytest.skip(
        "OMNISERVE_TEST_OFFICIAL_DEMO does not name a MiniCPM-o-Demo checkout",
        allow_module_level=True,
    )
if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is not installed", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def demo_stack(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    demo = Path(str(DEMO))
    voices = tmp_path_factory.mktemp("voices")
    for wav in (demo / "assets" / "ref_audio").glob("*.wav"):
        (voices / wav.name).write_bytes(wav.read_bytes())
    default = sorted(p.name for p in voices.glob("*.wav"))[0]
    s = Stack(redis_server)
    try:
        s.start_worker(OMNISERVE_BACKEND_OPTIONS='{"trigger": "always", "step_delay_s": 0.2}')
        s.start_gateway(
            OMNISERVE_STATIC_DIR=str(demo / "static"),
            OMNISERVE_PRESETS_DIR=str(demo / "assets" / "presets"),
            OMNISERVE_VOICES_DIR=str(voices),
            OMNISERVE_DEFAULT_VOICE=default,
        )
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                "--autoplay-policy=no-user-gesture-required",
            ],
        )
        try:
            yield b
        finally:
            b.close()


class Watched:
    """One page with its failed calls, console errors and WebSocket frames."""

    def __init__(self, browser: Any, url: str) -> None:
        self.ctx = browser.new_context(permissions=["microphone", "camera"])
        self.page = self.ctx.new_page()
        self.failed: list[str] = []
        self.console: list[str] = []
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.page.on("response", self._response)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.console.append(f"pageerror: {exc}"))
        self.page.on("websocket", self._socket)
        self.page.goto(url)
        self.page.wait_for_load_state("networkidle")

    def _response(self, r: Any) -> None:
        if r.status >= 400:
            self.failed.append(f"{r.status} {r.request.method} {r.url}")

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            self.console.append(msg.text)

    def _socket(self, ws: Any) -> None:
        ws.on("framesent", lambda f: self.sent.append(_json(f)))
        ws.on("framereceived", lambda f: self.received.append(_json(f)))

    def types(self, frames: list[dict[str, Any]]) -> list[str]:
        return [str(f.get("type")) for f in frames]

    def wait_for(self, kind: str, timeout_ms: int = TIMEOUT_MS) -> None:
        waited = 0
        while kind not in self.types(self.received):
            assert waited < timeout_ms, (kind, self.types(self.received)[-10:])
            self.page.wait_for_timeout(100)
            waited += 100

    def errors(self) -> list[dict[str, Any]]:
        return [f for f in self.received if f.get("type") == "error"]

    def close(self) -> None:
        self.ctx.close()


def _json(frame: Any) -> dict[str, Any]:
    if not isinstance(frame, str):
        return {"type": "<binary>"}
    try:
        value = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return {"type": "<not json>"}
    return value if isinstance(value, dict) else {"type": "<not an object>"}


def base(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.gateways[0][1]}"


def gaps_counted(stack: Stack) -> float:
    text = httpx.get(base(stack) + "/metrics", timeout=10).text
    match = re.search(r"^omniserve_client_playback_gaps_total ([0-9.e+]+)$", text, re.M)
    assert match
    return float(match.group(1))


@pytest.mark.parametrize("route", PAGES)
def test_pages_load_with_no_failed_call(demo_stack: Stack, browser: Any, route: str) -> None:
    page = Watched(browser, base(demo_stack) + route)
    page.page.wait_for_timeout(1500)  # the pages poll /status and load presets after load
    try:
        assert page.failed == []
        assert page.console == []
    finally:
        page.close()


def test_queued_user_is_served_after_the_first_leaves(demo_stack: Stack, browser: Any) -> None:
    first = Watched(browser, base(demo_stack) + "/audio_duplex")
    second = Watched(browser, base(demo_stack) + "/audio_duplex")
    try:
        first.page.click("#btnStart")
        first.wait_for("session.created")
        second.page.click("#btnStart")
        second.wait_for("session.queued")
        # the page sends its session.update ~100 ms after connecting, admitted or not
        second.page.wait_for_timeout(2000)
        assert "session.update" in second.types(second.sent)
        assert "session.queue_done" not in second.types(second.received)
        first.page.click("#btnStop")
        second.wait_for("session.created")
        second.wait_for("response.output_audio.delta")
        assert second.errors() == [] and first.errors() == []
        assert second.console == [] and second.failed == []
        second.page.click("#btnStop")
    finally:
        first.close()
        second.close()


class JitterProxy:
    """A TCP proxy that delivers each chunk up to ``jitter_s`` late, in order (a bad network)."""

    def __init__(self, upstream_port: int, jitter_s: float) -> None:
        self.upstream_port = upstream_port
        self.jitter_s = jitter_s
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> asyncio.Server:
            server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            return server

        self.server = self.loop.run_until_complete(start())
        ready.set()
        self.loop.run_forever()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        due = 0.0
        try:
            while data := await reader.read(65536):
                now = self.loop.time()
                due = max(due, now + random.uniform(0, self.jitter_s))
                await asyncio.sleep(due - now)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_omni_session_with_network_jitter(demo_stack: Stack, browser: Any) -> None:
    before = gaps_counted(demo_stack)
    proxy = JitterProxy(demo_stack.gateways[0][1], JITTER_S)
    page = Watched(browser, f"http://127.0.0.1:{proxy.port}/omni")
    try:
        page.page.click("#btnStart")
        page.wait_for("session.created")
        page.wait_for("response.output_audio.delta")
        page.page.wait_for_timeout(8000)  # the scripted worker speaks on every step
        assert page.errors() == []
        assert page.console == [] and page.failed == []
        closing = len(page.sent)
        page.page.click("#btnStop")
        gaps = [
            f
            for f in page.sent[:closing]
            if f.get("type") == "client_diagnostic" and f.get("event") == "gap"
        ]
        # the proxy still holds frames for up to JITTER_S: wait until the gateway has read
        # every report sent before the close (they precede it on the socket)
        waited = 0
        while (counted := gaps_counted(demo_stack) - before) < len(gaps) and waited < 20_000:
            page.page.wait_for_timeout(200)
            waited += 200
        every = [f for f in page.sent if f.get("event") == "gap"]
        assert len(gaps) <= counted <= len(every)  # reports sent after the close may be unread
    finally:
        page.close()
        proxy.stop()
