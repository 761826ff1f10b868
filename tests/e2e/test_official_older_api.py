"""The official gateway's older API on a real gateway and real scripted workers.

``POST /api/chat`` (one chat turn), ``WS /ws/duplex/{session_id}`` (queued/queue_done,
prepare -> prepared, audio_chunk -> result, stop -> stopped), ``PUT /api/config/eta`` read back
by ``GET``, and ref-audio upload and delete behind the admin token. Real HTTP (httpx) and
WebSocket clients speak the official shapes; after every session, and after bad input of every
kind, the worker slot is back in the pool.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile
import websockets

from tests.support.client import Client, jpeg_b64, silence, speech
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio

TOKEN = "admin-secret-for-older-api"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
API_KEY = "client-key-for-older-api"
MAX_UPLOAD = 20_000


def wav_b64(seconds: float, rate: int = 16000) -> str:
    t = np.arange(int(rate * seconds)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.2 * np.sin(2 * np.pi * 200 * t)), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("older-api")
    (root / "voices").mkdir()
    (root / "outside.wav").write_bytes(base64.b64decode(wav_b64(0.2)))
    return root / "voices"


@pytest.fixture(scope="module")
def stack(redis_server: str, voices: Path) -> Iterator[Stack]:
    s = Stack(redis_server, env={"OMNISERVE_VOICES_DIR": str(voices)})  # (workers read voices)
    try:
        s.start_worker(slots=1)
        s.start_gateway(OMNISERVE_ADMIN_TOKEN=TOKEN, OMNISERVE_REF_AUDIO_MAX_BYTES=str(MAX_UPLOAD))
        s.start_gateway(OMNISERVE_API_KEYS=f'["{API_KEY}"]')
        yield s
    finally:
        s.stop()


def http(stack: Stack, i: int = 0) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.gateways[i][1]}", timeout=30)


async def chat(stack: Stack, body: Any, i: int = 0, **kw: Any) -> httpx.Response:
    async with http(stack, i) as c:
        if isinstance(body, bytes):
            return await c.post("/api/chat", content=body, **kw)
        return await c.post("/api/chat", json=body, **kw)


async def duplex(stack: Stack, session_id: str = "adx_test") -> Client:
    return await Client.connect(stack.url(), f"/ws/duplex/{session_id}")


async def admitted(client: Client, prepare: dict[str, Any] | None = None) -> dict[str, Any]:
    """Through the queue to ``prepared`` (what the official pages do)."""
    await client.until("queue_done")
    await client.send({"type": "prepare", "system_prompt": "Be brief.", **(prepare or {})})
    return await client.until("prepared", "error")


# --------------------------------------------------------------------------- POST /api/chat


async def test_chat_is_answered_in_the_official_shape(stack: Stack) -> None:
    r = await chat(
        stack,
        {
            "messages": [{"role": "user", "content": "hello there"}],
            "generation": {"max_new_tokens": 50, "do_sample": False},
        },
    )
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["success"] is True and data["error"] is None
    assert data["text"] == "You said: hello there"
    assert data["audio_data"] is None  # no speech unless tts.enabled, as the official default
    assert data["tokens_generated"] == 4 and data["duration_ms"] > 0
    assert data["token_stats"]["generated_tokens"] == 4
    assert isinstance(data["queue_wait_ms"], int) and "estimated_queue_wait_s" in data
    stack.wait_free(1)


async def test_chat_with_speech_returns_the_whole_audio(stack: Stack) -> None:
    r = await chat(
        stack,
        {"messages": [{"role": "user", "content": "speak"}], "tts": {"enabled": True}},
    )
    data = r.json()
    assert r.status_code == 200 and data["success"] is True
    assert data["audio_sample_rate"] == 24000
    audio = np.frombuffer(base64.b64decode(data["audio_data"]), dtype="<f4")
    assert audio.size > 2400
    stack.wait_free(1)


@pytest.mark.parametrize(
    "body,status",
    [
        (b"{not json", 400),
        ({"messages": []}, 422),
        ({"nothing": 1}, 422),
        ({"messages": [{"role": "robot", "content": "x"}]}, 422),
        ({"messages": [{"role": "user", "content": [{"type": "image", "path": "/x"}]}]}, 422),
        ({"messages": [{"role": "user", "content": [{"type": "image", "data": "aGk="}]}]}, 422),
        ({"messages": [{"role": "user", "content": "x"}], "tts": {"ref_audio_path": "../x"}}, 422),
        ([1, 2], 422),
    ],
)
async def test_bad_chat_requests_get_the_official_error_shape(
    stack: Stack, body: Any, status: int
) -> None:
    r = await chat(stack, body)
    assert r.status_code == status, r.text
    assert "detail" in r.json()
    if status == 422:
        err = r.json()["detail"][0]
        assert err["loc"][0] == "body" and err["msg"] and err["type"]
    stack.wait_free(1)


async def test_chat_needs_the_api_key_where_one_is_set(stack: Stack) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    r = await chat(stack, body, i=1)
    assert r.status_code == 401 and r.json()["detail"]
    r = await chat(stack, body, i=1, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200 and r.json()["success"] is True


async def test_chat_waits_in_the_queue_behind_a_duplex_session(stack: Stack) -> None:
    first = await duplex(stack)
    assert (await admitted(first))["type"] == "prepared"
    waiting = asyncio.create_task(chat(stack, {"messages": [{"role": "user", "content": "q"}]}))
    await asyncio.sleep(1.5)
    assert not waiting.done()  # the only slot is held
    await first.send({"type": "stop"})
    await first.until("stopped")
    r = await asyncio.wait_for(waiting, 30)
    assert r.status_code == 200 and r.json()["success"] is True
    assert r.json()["queue_wait_ms"] >= 1000
    stack.wait_free(1)


async def test_a_chat_client_that_leaves_while_queued_leaks_nothing(stack: Stack) -> None:
    first = await duplex(stack)
    assert (await admitted(first))["type"] == "prepared"
    async with http(stack) as c:
        with pytest.raises(httpx.TimeoutException):
            await c.post(
                "/api/chat", json={"messages": [{"role": "user", "content": "q"}]}, timeout=1.0
            )
    await asyncio.sleep(1.5)  # the gateway notices the departure
    await first.send({"type": "stop"})
    await first.until("stopped")
    stack.wait_free(1)
    r = await chat(stack, {"messages": [{"role": "user", "content": "next"}]})
    assert r.json()["text"] == "You said: next"


# --------------------------------------------------------------------------- WS /ws/duplex


async def test_duplex_session_prepare_results_stop(stack: Stack) -> None:
    client = await duplex(stack, "adx_session_1")
    prepared = await admitted(client, {"config": {"max_kv_tokens": 8000}})
    assert prepared["type"] == "prepared" and prepared["prompt_length"] > 0
    results = []
    for audio in (speech(1.0), silence(1.0), silence(1.0), silence(1.0)):
        await client.send({"type": "audio_chunk", "audio_base64": audio})
        results.append(await client.recv())
    assert [r["type"] for r in results] == ["result"] * 4
    assert results[0]["is_listen"] is True  # the user is speaking
    spoken = [r for r in results if not r["is_listen"]]
    assert spoken and spoken[0]["text"]
    pcm = np.frombuffer(base64.b64decode(spoken[0]["audio_data"]), dtype="<f4")
    assert pcm.size == 24000  # the step's speech, whole
    assert [r["current_time"] for r in results] == [1, 2, 3, 4]
    assert all(isinstance(r["kv_cache_length"], int) for r in results)
    await client.send({"type": "stop"})
    assert (await client.recv())["type"] == "stopped"
    assert await client.closed() == 1000
    stack.wait_free(1)


async def test_second_duplex_client_is_queued_until_the_first_stops(stack: Stack) -> None:
    first = await duplex(stack, "adx_first")
    assert (await admitted(first))["type"] == "prepared"
    second = await duplex(stack, "omni_second")
    queued = await second.recv()
    assert queued["type"] == "queued"
    assert queued["position"] == 1 and queued["queue_length"] == 1
    assert queued["ticket_id"] and isinstance(queued["estimated_wait_s"], int | float)
    # the official pages send their prepare while still queued: it is kept for admission
    await second.send({"type": "prepare", "system_prompt": "Hi.", "max_slice_nums": 2})
    await first.send({"type": "stop"})
    await first.until("stopped")
    assert (await second.until("queue_done"))["type"] == "queue_done"
    assert (await second.until("prepared"))["type"] == "prepared"
    await second.send(
        {"type": "audio_chunk", "audio_base64": silence(0.5), "frame_base64_list": [jpeg_b64()]}
    )
    result = await second.recv()
    assert result["type"] == "result" and result["vision_slices"] == 2
    await second.send({"type": "stop"})
    await second.until("stopped")
    stack.wait_free(1)


async def test_bad_duplex_input_is_answered_and_the_session_goes_on(stack: Stack) -> None:
    client = await duplex(stack)
    await client.until("queue_done")
    await client.send({"type": "audio_chunk", "audio_base64": silence(0.5)})
    assert (await client.recv())["error"] == "Not prepared yet"
    await client.send("not json at all")
    assert (await client.recv())["type"] == "error"
    await client.send({"type": "prepare", "config": "not a dict"})
    assert (await client.recv())["type"] == "error"
    await client.send({"type": "prepare", "ref_audio_path": "../outside.wav"})
    assert "ref_audio_path" in (await client.recv())["error"]
    await client.send({"type": "prepare"})
    assert (await client.recv())["type"] == "prepared"
    await client.send({"type": "prepare"})
    assert (await client.recv())["error"] == "Session already prepared"
    bad = [
        {"type": "audio_chunk"},
        {"type": "audio_chunk", "audio_base64": "@@@"},
        {"type": "audio_chunk", "audio_base64": base64.b64encode(b"abc").decode()},
        {"type": "audio_chunk", "audio_base64": silence(0.1), "frame_base64_list": ["aGk="]},
        {"type": "audio_chunk", "audio_base64": silence(0.1), "force_listen": "yes"},
        {"type": "warp_drive"},
        {"type": "pause", "timeout": "long"},
    ]
    for frame in bad:
        await client.send(frame)
        answer = await client.recv()
        assert answer["type"] == "error" and isinstance(answer["error"], str), frame
    await client.send({"type": "audio_chunk", "audio_base64": silence(0.5)})
    assert (await client.recv())["type"] == "result"
    await client.send({"type": "pause", "timeout": 30})
    assert (await client.recv()) == {"type": "paused", "timeout": 30.0}
    await client.send({"type": "audio_chunk", "audio_base64": silence(0.5)})
    assert (await client.recv())["error"] == "Worker is paused"
    await client.send({"type": "resume"})
    assert (await client.recv())["type"] == "resumed"
    await client.send({"type": "stop"})
    await client.until("stopped")
    stack.wait_free(1)


async def test_a_pause_that_is_not_resumed_ends_with_timeout(stack: Stack) -> None:
    client = await duplex(stack)
    assert (await admitted(client))["type"] == "prepared"
    await client.send({"type": "pause", "timeout": 1})
    await client.until("paused")
    timeout = await client.until("timeout", timeout=15)
    assert timeout["reason"].startswith("Pause timeout")
    await client.closed()
    stack.wait_free(1)


async def test_a_duplex_client_that_vanishes_frees_its_slot(stack: Stack) -> None:
    client = await duplex(stack)
    assert (await admitted(client))["type"] == "prepared"
    await client.ws.close()
    stack.wait_free(1)
    queued = await duplex(stack)
    await queued.until("queue_done")
    await queued.ws.close()
    stack.wait_free(1)


async def test_duplex_needs_the_api_key_where_one_is_set(stack: Stack) -> None:
    client = await Client.connect(stack.url(1), "/ws/duplex/adx_x")
    denied = await client.recv()
    assert denied["type"] == "error" and "API key" in denied["error"]
    assert await client.closed() == 1008
    keyed = await Client.connect(stack.url(1), "/ws/duplex/adx_x", f"?api_key={API_KEY}")
    assert (await admitted(keyed))["type"] == "prepared"
    await keyed.send({"type": "stop"})
    await keyed.until("stopped")
    stack.wait_free(1)


@pytest.mark.parametrize("path", ["/ws/streaming/s1", "/ws/half_duplex/h1"])
async def test_sockets_the_official_gateway_no_longer_serves_are_refused_at_once(
    stack: Stack, path: str
) -> None:
    """A client of the removed endpoints (the demo's own streaming tests) is refused at the
    handshake, as by the official gateway, and takes no slot: chat and duplex go on."""
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        async with websockets.connect(stack.url() + path, open_timeout=30):
            pass
    assert refused.value.response.status_code == 403
    stack.wait_free(1)
    r = await chat(stack, {"messages": [{"role": "user", "content": "still there?"}]})
    assert r.status_code == 200 and r.json()["success"] is True
    stack.wait_free(1)


# --------------------------------------------------------------------------- ETA settings


async def test_eta_is_set_then_read_back(stack: Stack) -> None:
    async with http(stack) as c:
        body = {"eta_chat_s": 5.0, "eta_half_duplex_s": 8.0, "eta_duplex_s": 60.0}
        assert (await c.put("/api/config/eta", json=body)).status_code == 401
        r = await c.put("/api/config/eta", json={"eta_chat_s": "soon"}, headers=ADMIN)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "eta_chat_s"]
        r = await c.put("/api/config/eta", json={"ema_alpha": 3}, headers=ADMIN)
        assert r.status_code == 422
        r = await c.put(
            "/api/config/eta",
            json={**body, "eta_omni_duplex_s": 42.0, "ema_alpha": 0.5},
            headers=ADMIN,
        )
        assert r.status_code == 200, r.text
        got = (await c.get("/api/config/eta", headers=ADMIN)).json()
    assert got["config"]["eta_chat_s"] == 5.0
    assert got["config"]["eta_half_duplex_s"] == 8.0
    assert got["config"]["eta_audio_duplex_s"] == 120.0  # left out: its default
    assert got["ema_alpha"] == 0.5
    # a mode measured already is estimated from its measured holds; the baseline is for the rest
    assert got["ema_omni_duplex_s"] is not None
    assert got["estimate_omni_duplex_s"] == got["ema_omni_duplex_s"]
    stats = stack.redis().hgetall(stack.keys.duration_stats)
    assert stats[b"base_s:video"] == b"42.000" and stats[b"alpha"] == b"0.5000"


# --------------------------------------------------------------------------- ref audio


async def test_ref_audio_upload_use_and_delete(stack: Stack, voices: Path) -> None:
    body = {"name": "my_voice", "audio_base64": wav_b64(0.4, 24000)}
    async with http(stack) as c:
        assert (await c.post("/api/assets/ref_audio", json=body)).status_code == 401
        r = await c.post("/api/assets/ref_audio", json=body, headers=ADMIN)
        assert r.status_code == 200, r.text
        up = r.json()
        assert up == {
            "success": True,
            "id": "my_voice.wav",
            "name": "my_voice",
            "message": "Uploaded successfully, duration=400ms",
        }
        info = soundfile.info(voices / "my_voice.wav")
        assert info.samplerate == 16000 and info.channels == 1
        again = await c.post("/api/assets/ref_audio", json=body, headers=ADMIN)
        assert again.status_code == 409
        listed = (await c.get("/api/assets/ref_audio", headers=ADMIN)).json()
        assert "my_voice.wav" in [v["id"] for v in listed["ref_audios"]]
    # usable by name: a chat turn's voice, a duplex session's voice
    r = await chat(
        stack,
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tts": {"enabled": True, "ref_audio_path": "my_voice.wav"},
        },
    )
    assert r.status_code == 200 and r.json()["success"] is True
    client = await duplex(stack)
    assert (await admitted(client, {"ref_audio_path": "my_voice.wav"}))["type"] == "prepared"
    await client.send({"type": "stop"})
    await client.until("stopped")
    stack.wait_free(1)
    async with http(stack) as c:
        assert (await c.delete("/api/assets/ref_audio/my_voice.wav")).status_code == 401
        r = await c.delete("/api/assets/ref_audio/my_voice.wav", headers=ADMIN)
        assert r.status_code == 200 and r.json()["success"] is True
        assert not (voices / "my_voice.wav").exists()
        gone = await c.delete("/api/assets/ref_audio/my_voice.wav", headers=ADMIN)
        assert gone.status_code == 404 and gone.json()["detail"]
        outside = await c.delete("/api/assets/ref_audio/../outside.wav", headers=ADMIN)
        assert outside.status_code == 404
    assert (voices.parent / "outside.wav").exists()


@pytest.mark.parametrize(
    "name,audio,status",
    [
        ("../escape", wav_b64(0.2), 400),
        ("a/b", wav_b64(0.2), 400),
        (".hidden", wav_b64(0.2), 400),
        ("sp ace", wav_b64(0.2), 400),
        ("", wav_b64(0.2), 400),
        ("notaudio", base64.b64encode(b"hello, not audio" * 20).decode(), 400),
        ("notbase64", "@@@@", 400),
        ("toolarge", wav_b64(1.0), 413),
    ],
)
async def test_bad_ref_audio_uploads_are_refused(
    stack: Stack, voices: Path, name: str, audio: str, status: int
) -> None:
    async with http(stack) as c:
        r = await c.post(
            "/api/assets/ref_audio", json={"name": name, "audio_base64": audio}, headers=ADMIN
        )
        assert r.status_code == status, r.text
        assert r.json()["detail"]
        missing = await c.post("/api/assets/ref_audio", json={"name": "x"}, headers=ADMIN)
        assert missing.status_code == 422
    assert sorted(p.name for p in voices.iterdir()) == []  # nothing written, no temporary file
