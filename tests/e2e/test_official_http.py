"""The official demo's HTTP API and page routes on a real gateway.

A real gateway and scripted worker, a voices directory with a real WAV file, a presets
directory in the demo's YAML format and a static directory laid out like the demo's
``static/`` (small pages written here). Every endpoint the demo's pages call answers with the
official gateway's shape, from omniserve's live state; admin endpoints need the admin token and
the writes omniserve does not support answer 501, never 404 (the ETA and ref-audio writes:
tests/e2e/test_official_older_api.py).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile

from tests.support.client import Client
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio

TOKEN = "admin-secret-for-tests"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
PAGES = {
    "/": "index.html",
    "/turnbased": "turnbased.html",
    "/omni": "omni/omni.html",
    "/audio_duplex": "audio-duplex/audio_duplex.html",
    "/realtime": "realtime/realtime.html",
    "/admin": "admin.html",
}
STATUS_KEYS = {
    "gateway_healthy",
    "total_workers",
    "idle_workers",
    "busy_workers",
    "duplex_workers",
    "loading_workers",
    "error_workers",
    "offline_workers",
    "queue_length",
    "max_queue_size",
    "running_tasks",
}
PRESET = """\
id: english_call
order: 2
name: "English Call"
description: "English voice assistant"
system_prompt: "Streaming Omni Conversation."
ref_audio_path: "assets/ref_audio/voice.wav"
"""
PRESET_FIRST = """\
id: first
order: 1
name: "First"
system_content:
  - type: text
    text: "Mimic this voice."
  - type: audio
    path: "nested/other.wav"
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("official")
    voices = root / "voices"
    (voices / "nested").mkdir(parents=True)
    t = np.arange(24000) / 24000
    soundfile.write(voices / "voice.wav", (0.2 * np.sin(2 * np.pi * 220 * t)), 24000)
    soundfile.write(voices / "nested" / "other.wav", np.zeros(8000), 16000)
    (voices / ".hidden.wav").write_bytes(b"not listed")
    presets = root / "presets"
    (presets / "omni").mkdir(parents=True)
    (presets / "omni" / "english_call.yaml").write_text(PRESET)
    (presets / "omni" / "first.yaml").write_text(PRESET_FIRST)
    (presets / "omni" / "broken.yaml").write_text("id: [unclosed")
    static = root / "static"
    for route, name in PAGES.items():
        (static / name).parent.mkdir(parents=True, exist_ok=True)
        (static / name).write_text(f"<!doctype html><title>page {route}</title>")
    (static / "omni" / "omni-app.js").write_text("export const page = 'omni';")
    (root / "secret.txt").write_text("outside the static directory")
    return {"voices": voices, "presets": presets, "static": static}


@pytest.fixture(scope="module")
def site(redis_server: str, files: dict[str, Path]) -> Iterator[Stack]:
    s = Stack(redis_server)
    try:
        s.start_worker(slots=2)
        s.start_gateway(
            OMNISERVE_ADMIN_TOKEN=TOKEN,
            OMNISERVE_VOICES_DIR=str(files["voices"]),
            OMNISERVE_DEFAULT_VOICE="voice.wav",
            OMNISERVE_PRESETS_DIR=str(files["presets"]),
            OMNISERVE_STATIC_DIR=str(files["static"]),
            OMNISERVE_PLAYBACK_DELAY_MS="350",
        )
        yield s
    finally:
        s.stop()


async def get(
    stack: Stack, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.gateways[0][1]}") as http:
        return await http.request(method, path, headers=headers or {}, json=None)


async def ok(stack: Stack, path: str, admin: bool = False) -> Any:
    r = await get(stack, path, ADMIN if admin else None)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


def pcm(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<f4")


async def wait_json(
    stack: Stack, path: str, want: dict[str, Any], admin: bool = False
) -> dict[str, Any]:
    """Poll ``path`` until its top-level fields have the wanted values (the view is read from
    Redis at most every 0.5 s and slots come back asynchronously)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        body: dict[str, Any] = await ok(stack, path, admin)
        if all(body[k] == v for k, v in want.items()):
            return body
        assert loop.time() < deadline, (want, body)
        await asyncio.sleep(0.05)


async def wait_status(stack: Stack, **want: int) -> dict[str, Any]:
    return await wait_json(stack, "/status", want)


# --------------------------------------------------------------------------- public


async def test_status_counts_slots_and_sessions(site: Stack) -> None:
    idle = await wait_status(site, idle_workers=2)
    assert set(idle) == STATUS_KEYS
    assert idle["total_workers"] == 2 and idle["queue_length"] == 0
    assert idle["max_queue_size"] == 1000 and idle["gateway_healthy"] is True
    assert idle["running_tasks"] == []

    c = await Client.connect(site.url(), query="?mode=video")
    created = await c.init()
    try:
        busy = await wait_status(site, idle_workers=1, duplex_workers=1)
        (task,) = busy["running_tasks"]
        assert task["request_type"] == "omni_duplex"
        assert task["worker_id"] in ("slot0", "slot1")  # public: no node or host names
        assert task["elapsed_s"] >= 0 and task["estimated_remaining_s"] >= 0
        assert task["started_at"].endswith("+00:00")

        (held,) = (await ok(site, "/api/queue", admin=True))["running_tasks"]
        assert held["worker_id"].endswith(("|0", "|1"))  # admin: the slot id
        sessions = await ok(site, "/sessions", admin=True)
        assert sessions["total"] == 1
        assert sessions["sessions"][0]["session_id"] == created["session_id"]
        assert sessions["sessions"][0]["worker_id"] == held["worker_id"]
        workers = await ok(site, "/workers", admin=True)
        assert workers["total"] == 2
        by_slot = {w["worker_id"]: w for w in workers["workers"]}
        mine = by_slot[held["worker_id"]]
        assert mine["status"] == "duplex_active"
        assert mine["current_session_id"] == created["session_id"]
        assert mine["current_request_type"] == "omni_duplex"
        (other,) = [w for w in workers["workers"] if w is not mine]
        assert other["status"] == "idle" and other["current_session_id"] is None
        assert {"host", "port", "gpu_id", "total_requests", "avg_inference_time_ms"} <= set(mine)
    finally:
        await c.close()
    await wait_status(site, idle_workers=2)


async def test_apps_and_frontend_defaults(site: Stack) -> None:
    apps = (await ok(site, "/api/apps"))["apps"]
    assert [a["app_id"] for a in apps] == ["turnbased", "omni", "audio_duplex", "realtime"]
    assert all(set(a) == {"app_id", "name", "route"} for a in apps)
    assert await ok(site, "/api/frontend_defaults") == {"playback_delay_ms": 350}


async def test_default_ref_audio_is_the_configured_voice(site: Stack) -> None:
    voice = await ok(site, "/api/default_ref_audio")
    assert voice["name"] == "voice.wav" and voice["sample_rate"] == 16000
    samples = pcm(voice["base64"])
    assert samples.size == voice["samples"] == 16000  # 1 s at 24 kHz, resampled to 16 kHz
    assert voice["duration"] == 1.0
    assert 0.1 < float(np.abs(samples).max()) < 0.3  # the tone, not silence


async def test_presets_in_the_demo_format(site: Stack) -> None:
    presets = await ok(site, "/api/presets")
    assert list(presets) == ["omni"]
    first, english = presets["omni"]  # ordered by "order"; the broken file is skipped
    assert first["id"] == "first" and english["id"] == "english_call"
    assert english["system_prompt"] == "Streaming Omni Conversation."
    assert "ref_audio_path" not in english
    # a demo-relative path is found in the voices directory by its file name
    assert english["ref_audio"] == {
        "data": None,
        "path": "assets/ref_audio/voice.wav",
        "name": "voice.wav",
        "duration": 1.0,
    }
    audio_item = first["system_content"][1]
    assert audio_item["data"] is None and audio_item["duration"] == 0.5

    loaded = await ok(site, "/api/presets/omni/english_call/audio")
    assert pcm(loaded["ref_audio"]["data"]).size == 16000
    loaded = await ok(site, "/api/presets/omni/first/audio")
    (item,) = loaded["system_content_audio"]
    assert item["name"] == "other.wav" and pcm(item["data"]).size == 8000
    missing = await get(site, "/api/presets/omni/nope/audio")
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


# --------------------------------------------------------------------------- admin

ADMIN_READS = [
    "/workers",
    "/api/queue",
    "/sessions",
    "/api/sessions",
    "/api/config/eta",
    "/api/assets/ref_audio",
    "/api/admin/apps",
]
ADMIN_WRITES = [
    ("PUT", "/api/admin/apps/omni"),
    ("POST", "/api/assets/ref_audio/external"),
    ("DELETE", "/api/queue/ticket_x_1"),
    ("DELETE", "/sessions/rt_1_ab"),
]


@pytest.mark.parametrize("path", ADMIN_READS)
async def test_admin_reads_need_the_token(site: Stack, path: str) -> None:
    assert (await get(site, path)).status_code == 401
    assert (await get(site, path, {"Authorization": "Bearer wrong"})).status_code == 401
    assert (await get(site, path, ADMIN)).status_code == 200


@pytest.mark.parametrize("method,path", ADMIN_WRITES)
async def test_unsupported_admin_writes_answer_501(site: Stack, method: str, path: str) -> None:
    assert (await get(site, path, method=method)).status_code == 401
    r = await get(site, path, ADMIN, method=method)
    assert r.status_code == 501
    body = r.json()
    assert body["supported"] is False and body["detail"]


async def test_admin_shapes(site: Stack) -> None:
    eta = await ok(site, "/api/config/eta", admin=True)
    assert set(eta["config"]) >= {"eta_chat_s", "eta_audio_duplex_s", "eta_omni_duplex_s"}
    assert eta["ema_alpha"] == 0.2 and eta["config"]["eta_chat_s"] == 15.0
    voices = await ok(site, "/api/assets/ref_audio", admin=True)
    assert voices["total"] == 2
    assert [v["id"] for v in voices["ref_audios"]] == ["nested/other.wav", "voice.wav"]
    assert all(v["source_type"] == "voices_dir" for v in voices["ref_audios"])
    apps = (await ok(site, "/api/admin/apps", admin=True))["apps"]
    assert all(a["enabled"] is True for a in apps) and len(apps) == 4


async def test_queue_lists_waiting_clients(site: Stack) -> None:
    holders = [await Client.connect(site.url(), query="?mode=audio") for _ in range(2)]
    for h in holders:
        await h.init()
    waiting = await Client.connect(site.url(), query="?mode=audio")
    chat = await Client.connect(site.url(), query="?mode=chat")
    try:
        queued = await waiting.until("session.queued")
        chat_id = (await chat.init())["session_id"]
        turn = {"messages": [{"role": "user", "content": "Reply with exactly: hi"}]}
        await chat.send({"type": "input.append", "input": turn})
        await chat.until("response.queued")  # a chat turn waits for a slot too
        q = await wait_json(site, "/api/queue", {"queue_length": 2}, admin=True)
        assert q["max_queue_size"] == 1000
        first, second = q["items"]
        assert first["ticket_id"] == queued["ticket_id"] and first["position"] == 1
        assert first["request_type"] == "audio_duplex"
        assert first["session_id"].startswith("rt_")
        assert first["wait_elapsed_s"] >= 0 and first["estimated_wait_s"] >= 0
        assert (second["request_type"], second["session_id"]) == ("chat", chat_id)
        assert second["position"] == 2
        assert [t["request_type"] for t in q["running_tasks"]] == ["audio_duplex"] * 2
        await wait_status(site, queue_length=2, idle_workers=0)
    finally:
        for c in (waiting, chat, *holders):
            await c.close()
    await wait_status(site, idle_workers=2, queue_length=0)


# --------------------------------------------------------------------------- pages


@pytest.mark.parametrize("route", list(PAGES))
async def test_static_dir_pages(site: Stack, route: str) -> None:
    r = await get(site, route)
    assert r.status_code == 200 and f"page {route}</title>" in r.text
    assert r.headers["content-type"].startswith("text/html")


async def test_static_files_and_own_client(site: Stack) -> None:
    r = await get(site, "/static/omni/omni-app.js")
    assert r.status_code == 200 and "page = 'omni'" in r.text
    assert (await get(site, "/static/../secret.txt")).status_code == 404
    assert (await get(site, "/static/%2e%2e/secret.txt")).status_code == 404
    assert (await get(site, "/favicon.ico")).status_code == 204  # browsers ask; none here
    stop = await get(site, "/api/streaming/stop", method="POST")
    assert stop.status_code == 501 and stop.json()["supported"] is False
    own = await get(site, "/web/")
    assert own.status_code == 200 and "/web/app.js" in own.text  # omniserve's own client
    assert (await get(site, "/ops")).status_code == 200


async def test_without_static_dir_the_own_client_is_home(service: Stack) -> None:
    r = await get(service, "/")
    assert r.status_code == 200 and "/web/app.js" in r.text
    assert (await get(service, "/omni")).status_code == 404
    # the API answers without any of the optional directories
    assert (await ok(service, "/api/presets")) == {}
    missing = await get(service, "/api/default_ref_audio")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "No default ref audio configured"
    assert (await ok(service, "/status"))["total_workers"] == 1
