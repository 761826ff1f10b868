"""The minicpmo and llama_omni backends through the real worker and gateway.

For each backend, with its stand-in (``tests.support.standins.fake_minicpmo`` - strict: it faults
where the model would corrupt its state - loaded by configuration alone; the mock
``llama-omni-server`` run as its own process), one real ``omniserve worker`` (Celery) and one
real ``omniserve gateway`` (uvicorn) share the test run's private Redis, and a client talks to
the gateway over real WebSockets: chat turns, audio and video duplex sessions, force_listen,
chunks shorter and longer than the model's one-second unit, the backend's fatal close and the
8192-token context stop.

Every duplex exchange is paced: one second of input, then wait for its reply (matched by
``input_id``) before the next, so each step is deterministic.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from omniserve.redis_server import free_port
from tests.support.client import Client, decode_audio, jpeg_b64, pcm_b64, silence, speech
from tests.support.minicpmo_helpers import fake_minicpmo_stack
from tests.support.stack import LOG_DIR, ROOT, Proc, Stack

pytestmark = pytest.mark.asyncio

SPOKEN = "Hello there, how can I help?"  # both stand-ins speak tests.support.standins.*.SPEECH
MOCK_SERVER = "tests.support.standins.mock_llama_omni_server"


# --------------------------------------------------------------------------- stacks


def _start_mock_llama_server(prefix: str) -> tuple[Proc, str]:
    """``python -m tests.support.standins.mock_llama_omni_server --port N`` as its own process."""
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{prefix}-mock-llama-omni-server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as fh:
        popen = subprocess.Popen(
            [sys.executable, "-m", MOCK_SERVER, "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = Proc(popen, log, "mock-llama-omni-server")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"mock llama-omni-server exited:\n{proc.tail()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.stop()
    raise RuntimeError(f"mock llama-omni-server did not start:\n{proc.tail()}")


@pytest.fixture(scope="module")
def minicpmo_stack(redis_server: str) -> Iterator[Stack]:
    """Rollover off: these sessions run into the model's own context window."""
    with fake_minicpmo_stack(redis_server, OMNISERVE_ROLLOVER="false") as s:
        yield s


@pytest.fixture(scope="module")
def llama_stack(redis_server: str) -> Iterator[Stack]:
    """A gateway and one ``llama_omni`` worker talking to the mock llama-omni-server process."""
    s = Stack(redis_server)
    server: Proc | None = None
    try:
        server, url = _start_mock_llama_server(s.prefix)
        s.start_worker(
            "llama_omni",
            OMNISERVE_BACKEND_URL=url,
            OMNISERVE_BACKEND_OPTIONS=json.dumps({"step_timeout_s": 10, "connect_timeout_s": 5}),
            OMNISERVE_ROLLOVER="false",  # its sessions run into the context window
        )
        s.start_gateway()
        yield s
    finally:
        s.stop()
        if server is not None:
            server.stop(signal.SIGTERM, timeout=5)


@pytest.fixture(params=["minicpmo", "llama_omni"])
def backend_stack(request: pytest.FixtureRequest) -> Stack:
    """Each test using this runs once per backend; the worker's only slot is idle at the start."""
    s: Stack = request.getfixturevalue(
        "minicpmo_stack" if request.param == "minicpmo" else "llama_stack"
    )
    s.wait_free(1, timeout=20)
    return s


# --------------------------------------------------------------------------- client helpers

_OPEN: list[Client] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> Any:
    """A failed test must not leave a session holding the module's only worker slot."""
    yield
    while _OPEN:
        with contextlib.suppress(Exception):
            await _OPEN.pop().ws.close()


async def connect(stack: Stack, mode: str) -> Client:
    c = await Client.connect(stack.url(), query=f"?mode={mode}")
    _OPEN.append(c)
    return c


def voice_b64(seconds: float = 1.0) -> str:
    """A reference voice: base64 float32 PCM at 16 kHz (the minicpmo stand-in speaks with it)."""
    t = np.arange(int(16000 * seconds)) / 16000
    return pcm_b64((0.1 * np.sin(2 * np.pi * 180 * t)).astype(np.float32))


class Duplex:
    """A duplex session driven one chunk at a time."""

    def __init__(self, client: Client) -> None:
        self.c = client
        self.sent = 0

    async def step(self, audio: str, timeout: float = 15.0, **fields: Any) -> list[dict[str, Any]]:
        """Send one chunk; return every delta up to the one that ends this chunk's step.

        A listening step ends with its ``listen`` delta; a speaking step is ``text`` then ``audio``
        (both carry the chunk's ``input_id``). An ``error`` or ``session.closed`` ends the wait too.
        """
        self.sent += 1
        input_id = f"input_{self.sent}"
        await self.c.send({"type": "input.append", "input": {"audio": audio, **fields}})
        frames: list[dict[str, Any]] = []
        loop_deadline = time.monotonic() + timeout
        while True:
            ev = await self.c.recv(max(0.01, loop_deadline - time.monotonic()))
            if ev["type"] in ("error", "session.closed"):
                frames.append(ev)
                return frames
            if ev["type"] != "response.output.delta":
                continue
            frames.append(ev)
            if ev.get("input_id") == input_id and ev["kind"] in ("listen", "audio"):
                return frames


def deltas(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "response.output.delta"]


def assert_listen_only(frames: list[dict[str, Any]]) -> dict[str, Any]:
    assert [f["type"] for f in frames] == ["response.output.delta"], frames
    ev = frames[0]
    assert ev["kind"] == "listen" and ev["text"] == "", ev
    assert isinstance(ev["metrics"].get("kv_cache_length"), int), ev
    return ev


def assert_speech_audio(ev: dict[str, Any]) -> np.ndarray:
    """An audio delta: base64 float32 PCM at 24 kHz, at most one second, real sound."""
    assert ev["kind"] == "audio" and ev["response_id"].startswith("resp_"), ev
    audio = decode_audio(ev["audio"])
    assert audio.dtype == np.float32
    assert 0 < audio.size <= 24000, audio.size
    assert np.isfinite(audio).all() and float(np.abs(audio).max()) > 0.05
    return audio


async def open_duplex(
    stack: Stack, mode: str, payload: dict[str, Any]
) -> tuple[Client, Duplex, dict[str, Any]]:
    c = await connect(stack, mode)
    created = await c.init(payload)
    assert created["mode"] == "full_duplex" and created["session_id"].startswith("rt_")
    return c, Duplex(c), created


async def close_session(stack: Stack, c: Client, reason: str = "user_stop") -> None:
    await c.send({"type": "session.close", "reason": reason})
    closed = await c.until("session.closed")
    assert closed["reason"] == reason
    await c.close()
    stack.wait_free(1, timeout=10)


# --------------------------------------------------------------------------- both backends


async def test_chat_streaming_and_non_streaming(backend_stack: Stack) -> None:
    c = await connect(backend_stack, "chat")
    created = await c.init()
    assert created["mode"] == "turn_based"
    # streaming: text deltas, then response.done with the whole answer
    await c.send(
        {
            "type": "input.append",
            "input": {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "the quick brown fox"},
                ],
                "streaming": True,
            },
        }
    )
    frames = await c.collect_until("response.done", "error")
    assert frames[-1]["type"] == "response.done", frames
    ds = [f for f in frames if f["type"] == "response.output.delta"]
    assert len(ds) >= 2 and {d["kind"] for d in ds} == {"text"}, ds
    done = frames[-1]
    assert "".join(d["text"] for d in ds) == done["text"] == "echo: the quick brown fox"
    assert all(d["response_id"] == done["response_id"] for d in ds)
    assert done["reason"] == "turn_end"
    # non-streaming: no deltas, only response.done
    await c.send(
        {
            "type": "input.append",
            "input": {
                "messages": [{"role": "user", "content": "only the end"}],
                "streaming": False,
            },
        }
    )
    # (the turn may queue briefly: the previous turn's slot is released after its response.done)
    frames = [
        f
        for f in await c.collect_until("response.done", "error")
        if not f["type"].startswith("response.queue")
    ]
    assert [f["type"] for f in frames] == ["response.done"], frames
    assert frames[0]["text"] == "echo: only the end"
    assert frames[0]["response_id"] != done["response_id"]
    await close_session(backend_stack, c, "turn_done")


async def test_audio_duplex_turn_and_force_listen(backend_stack: Stack) -> None:
    c, d, created = await open_duplex(
        backend_stack,
        "audio",
        {
            "system_prompt": "You are a helpful assistant.",
            "voice": {"ref_audio_base64": voice_b64()},
        },
    )
    assert created["prompt_length"] > 0
    # quiet input: the model listens
    for _ in range(2):
        assert_listen_only(await d.step(silence()))
    # a loud chunk then quiet ones: the stand-in's trigger for a spoken turn
    assert_listen_only(await d.step(speech()))
    text, audio, response_ids, end_flags = "", [], set(), []
    for _ in range(3):
        frames = await d.step(silence())
        kinds = [f["kind"] for f in deltas(frames)]
        assert kinds == ["text", "audio"], frames
        end_flags.append(frames[-1]["metrics"]["end_of_turn"])
        for f in frames:
            response_ids.add(f["response_id"])
            if f["kind"] == "text":
                text += f["text"]
            else:
                audio.append(assert_speech_audio(f))
    assert text == SPOKEN
    assert len(response_ids) == 1, response_ids  # one response for the whole turn
    assert end_flags == [False, False, True], end_flags  # the last step ends the turn
    assert [a.size for a in audio[:-1]] == [24000] * (len(audio) - 1)  # middle deltas: exactly 1 s
    # after the turn the model listens again
    assert_listen_only(await d.step(silence()))

    # a second turn, interrupted by force_listen
    assert_listen_only(await d.step(speech()))
    frames = await d.step(silence())
    assert [f["kind"] for f in deltas(frames)] == ["text", "audio"], frames
    interrupted = frames[0]["response_id"]
    assert frames[0]["text"] == "Hello"
    mark = len(c.received)
    # force_listen mid-turn: the very next delta is listen, no more audio of that response
    ev = assert_listen_only(await d.step(silence(), force_listen=True))
    assert ev["metrics"].get("force_listen") is True, ev
    # the interrupted response does not resume (the stand-ins would have spoken two more pieces)
    for _ in range(2):
        assert_listen_only(await d.step(silence()))
    assert not [f for f in c.received[mark:] if f.get("response_id") == interrupted]
    await close_session(backend_stack, c)


async def test_session_close_before_any_input(backend_stack: Stack) -> None:
    c, _d, _ = await open_duplex(
        backend_stack, "audio", {"voice": {"ref_audio_base64": voice_b64()}}
    )
    await close_session(backend_stack, c)


async def test_older_dialect_audio_duplex(backend_stack: Stack) -> None:
    """spec/04: session.update, input_audio_buffer.append, response.listen / output_audio.delta."""
    c = await connect(backend_stack, "audio")
    await c.until("session.queue_done", timeout=30)
    await c.send(
        {
            "type": "session.update",
            "session": {"instructions": "You are a helpful assistant.", "ref_audio": voice_b64()},
        }
    )
    created = await c.until("session.created")
    assert created["prompt_length"] > 0

    async def append(audio: str) -> dict[str, Any]:
        await c.send({"type": "input_audio_buffer.append", "audio": audio})
        return await c.until("response.listen", "response.output_audio.delta", "error")

    for _ in range(2):  # MiniCPM-o listens for the first three units (the demo's default)
        ev = await append(silence())
        assert ev["type"] == "response.listen" and ev["kv_cache_length"] > 0, ev
    assert (await append(speech()))["type"] == "response.listen"
    spoken, sizes, ends = "", [], []
    for _ in range(3):
        ev = await append(silence())
        assert ev["type"] == "response.output_audio.delta", ev
        spoken += ev["text"]
        sizes.append(decode_audio(ev["audio"]).size)
        ends.append(ev["end_of_turn"])
        assert 0 < ev["kv_cache_length"] < 8192
    assert spoken == SPOKEN and ends == [False, False, True]
    assert sizes[:2] == [24000, 24000] and 0 < sizes[2] <= 24000
    assert (await append(silence()))["type"] == "response.listen"
    await c.send({"type": "session.close", "reason": "user_stop"})
    closed = await c.until("session.closed")
    assert closed["reason"] == "stopped"  # spec/04: the confirmation of a client close
    backend_stack.wait_free(1, timeout=10)


async def test_worker_reports_its_backend(backend_stack: Stack) -> None:
    port = backend_stack.gateways[0][1]
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
    assert health["status"] == "ok" and health["worker_slots"] == 1
    workers = httpx.get(f"http://127.0.0.1:{port}/v1/workers", timeout=5).json()["workers"]
    info = workers[0]["backend"]
    assert info["backend"] in ("minicpmo", "llama_omni")
    assert info["max_context_tokens"] == 8192
    if info["backend"] == "minicpmo":
        assert info["model_path"] == "/tmp/none" and info["device"] == "cpu"
    else:
        assert info["backend_url"].startswith("http://127.0.0.1:")


# --------------------------------------------------------------------------- minicpmo


async def test_minicpmo_init_without_any_voice_is_invalid_payload(minicpmo_stack: Stack) -> None:
    """No voice in session.init and no default voice on the worker: the init is refused, the
    session goes on (inference.base.UnsupportedInput: "reported as invalid_payload")."""
    minicpmo_stack.wait_free(1, timeout=20)
    c = await connect(minicpmo_stack, "audio")
    await c.until("session.queue_done", timeout=30)
    await c.send({"type": "session.init", "payload": {"system_prompt": "hi"}})
    ev = await c.until("error", "session.created", "session.closed")
    assert ev["type"] == "error", ev
    assert ev["error"]["code"] == "invalid_payload", ev
    assert "voice" in (ev["error"].get("field") or ev["error"]["message"])
    # the client may try again, with a voice
    await c.send({"type": "session.init", "payload": {"voice": {"ref_audio_base64": voice_b64()}}})
    ev = await c.until("session.created", "session.closed", "error")
    assert ev["type"] == "session.created", ev
    await close_session(minicpmo_stack, c)


async def test_minicpmo_video_frame(minicpmo_stack: Stack) -> None:
    minicpmo_stack.wait_free(1, timeout=20)
    c, d, created = await open_duplex(
        minicpmo_stack,
        "video",
        {"instructions": "Describe what you see.", "voice": {"ref_audio_base64": voice_b64()}},
    )
    kv0 = created["prompt_length"]
    ev = assert_listen_only(await d.step(silence(), video_frames=[jpeg_b64()], max_slice_nums=2))
    assert ev["metrics"]["vision_frames"] == 1
    # spec/03: the overview and its two slices, 64 tokens each
    assert (ev["metrics"]["vision_slices"], ev["metrics"]["vision_tokens"]) == (3, 192)
    kv1 = ev["metrics"]["kv_cache_length"]
    assert kv1 - kv0 >= 66 * 3  # one frame at 2 slices (+ the overview) went into the context
    ev = assert_listen_only(await d.step(silence()))  # audio only
    assert ev["metrics"]["vision_frames"] == 0 and ev["metrics"]["kv_cache_length"] < kv1 + 66
    assert (ev["metrics"]["vision_slices"], ev["metrics"]["vision_tokens"]) == (0, 0)
    await close_session(minicpmo_stack, c)


async def send_unit(d: Duplex, audio: np.ndarray, pieces: int, barge_in: bool = False) -> list:
    """One second of input as ``pieces`` chunks (``force_listen`` on the first when
    ``barge_in``); returns the deltas up to the reply, which comes for the chunk ending it."""
    parts = np.array_split(audio, pieces)
    for i, part in enumerate(parts[:-1]):
        d.sent += 1
        fields = {"force_listen": True} if barge_in and i == 0 else {}
        await d.c.send({"type": "input.append", "input": {"audio": pcm_b64(part), **fields}})
    return await d.step(pcm_b64(parts[-1]))


@pytest.mark.parametrize("pieces", [4, 3])
async def test_minicpmo_quarter_second_chunks_are_buffered_into_units(
    minicpmo_stack: Stack, pieces: int
) -> None:
    """The model consumes exactly one second per step; 250 ms (and uneven) chunks
    are buffered by the worker, and a barge-in in a unit's first chunk closes the speaking turn.
    A short prefill, or a turn left open, would show in the strict stand-in's replies."""
    minicpmo_stack.wait_free(1, timeout=20)
    c, d, _ = await open_duplex(
        minicpmo_stack, "audio", {"voice": {"ref_audio_base64": voice_b64()}}
    )
    quiet = np.zeros(16000, dtype=np.float32)
    loud = (0.2 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)).astype(np.float32)
    for audio in (quiet, quiet, loud):  # the start-up guard, then the user speaks
        ev = assert_listen_only(await send_unit(d, audio, pieces))
        assert ev["input_id"] == f"input_{d.sent}"  # the chunk that completed the unit
    text = ""
    for _ in range(3):
        frames = await send_unit(d, quiet, pieces)
        assert [f["kind"] for f in deltas(frames)] == ["text", "audio"], frames
        text += frames[0]["text"]
    assert text == SPOKEN
    # a second turn, interrupted by the user speaking with force_listen
    assert_listen_only(await send_unit(d, loud, pieces))
    frames = await send_unit(d, quiet, pieces)
    assert deltas(frames)[0]["text"] == "Hello"
    interrupted = frames[0]["response_id"]
    mark = len(c.received)
    ev = assert_listen_only(await send_unit(d, loud, pieces, barge_in=True))
    assert ev["metrics"]["force_listen"] is True
    frames = await send_unit(d, quiet, pieces)  # answers the barge-in: a new turn from its start
    assert deltas(frames)[0]["text"] == "Hello", frames
    assert frames[0]["response_id"] != interrupted
    assert not [f for f in c.received[mark:] if f.get("response_id") == interrupted]
    assert not [f for f in c.received if f["type"] == "error"]
    await close_session(minicpmo_stack, c)


async def test_minicpmo_long_chunks_do_not_lag(minicpmo_stack: Stack) -> None:
    """A 1.5 s chunk is one unit and half of the next, never a backlog in the
    model (the strict stand-in faults when its audio buffer lags the input)."""
    minicpmo_stack.wait_free(1, timeout=20)
    c, d, _ = await open_duplex(
        minicpmo_stack, "audio", {"voice": {"ref_audio_base64": voice_b64()}}
    )
    replies = []
    for n, units in enumerate([1, 2, 1, 2], start=1):  # 4 chunks of 1.5 s: 6 units
        await c.send({"type": "input.append", "input": {"audio": silence(1.5)}})
        for _ in range(units):
            ev = await c.until("response.output.delta", "error")
            assert ev["type"] == "response.output.delta" and ev["kind"] == "listen", ev
            replies.append(ev["input_id"])
        d.sent = n
    assert replies == ["input_1", "input_2", "input_2", "input_3", "input_4", "input_4"]
    await close_session(minicpmo_stack, c)


async def test_minicpmo_older_dialect_quarter_second_chunks(minicpmo_stack: Stack) -> None:
    """spec/04 allows 4000-sample appends: four make one step and one reply."""
    minicpmo_stack.wait_free(1, timeout=20)
    c = await connect(minicpmo_stack, "audio")
    await c.until("session.queue_done", timeout=30)
    await c.send(
        {"type": "session.update", "session": {"instructions": "hi", "ref_audio": voice_b64()}}
    )
    await c.until("session.created")
    replies = []
    for quarter in (silence(0.25), silence(0.25), speech(0.25), silence(0.25)):
        for _ in range(4):
            await c.send({"type": "input_audio_buffer.append", "audio": quarter})
        replies.append(await c.until("response.listen", "response.output_audio.delta", "error"))
    kinds = [r["type"] for r in replies]
    assert kinds == ["response.listen"] * 3 + ["response.output_audio.delta"], replies
    assert replies[-1]["text"] == "Hello" and decode_audio(replies[-1]["audio"]).size == 24000
    await c.send({"type": "session.close", "reason": "user_stop"})
    assert (await c.until("session.closed"))["reason"] == "stopped"
    minicpmo_stack.wait_free(1, timeout=10)


async def test_minicpmo_context_full_closes_session(minicpmo_stack: Stack) -> None:
    """The real 8192-token window: 8 frames at 9 slices cost ~5300 tokens a step in the stand-in."""
    minicpmo_stack.wait_free(1, timeout=20)
    c, d, _ = await open_duplex(
        minicpmo_stack, "video", {"voice": {"ref_audio_base64": voice_b64()}}
    )
    frames8 = [jpeg_b64((30 * i, 200 - 20 * i, 90)) for i in range(8)]
    ev = assert_listen_only(await d.step(silence(), video_frames=frames8, max_slice_nums=9))
    assert 5000 < ev["metrics"]["kv_cache_length"] < 8192
    # the next such step could cross the window: it is not run and the session closes
    await c.send(
        {
            "type": "input.append",
            "input": {"audio": silence(), "video_frames": frames8, "max_slice_nums": 9},
        }
    )
    frames = await c.collect_until("session.closed")
    closed = frames[-1]
    assert closed["reason"] == "context_full", frames
    assert not [f for f in frames if f["type"] == "error"], frames
    last = [f for f in frames if f["type"] == "response.output.delta"]
    if last:  # the skipped step is reported as listen with the full window
        assert last[-1]["kind"] == "listen" and last[-1]["metrics"].get("context_full") is True
    await c.closed(timeout=5)
    minicpmo_stack.wait_free(1, timeout=10)
    # the slot serves the next session with a fresh context
    c2, d2, created2 = await open_duplex(
        minicpmo_stack, "audio", {"voice": {"ref_audio_base64": voice_b64()}}
    )
    assert created2["prompt_length"] < 200
    ev = assert_listen_only(await d2.step(silence()))
    assert ev["metrics"]["kv_cache_length"] < 300
    await close_session(minicpmo_stack, c2)


# --------------------------------------------------------------------------- llama_omni


async def test_llama_omni_server_closing_the_session_is_fatal(llama_stack: Stack) -> None:
    llama_stack.wait_free(1, timeout=20)
    c, d, _ = await open_duplex(llama_stack, "audio", {"config": {"mock_fail_at_chunk": 2}})
    assert_listen_only(await d.step(silence()))
    frames = await d.step(silence())  # the mock server sends session.closed (prefill_failed)
    assert frames[-1]["type"] == "error", frames
    err = frames[-1]["error"]
    assert err["code"] == "backend_error" and "prefill_failed" in err["message"], err
    closed = await c.until("session.closed", timeout=10)
    assert closed["reason"] == "backend_error"
    await c.closed(timeout=5)
    # the worker slot is free again and the next session works end to end
    llama_stack.wait_free(1, timeout=10)
    c2, d2, _ = await open_duplex(llama_stack, "audio", {})
    assert_listen_only(await d2.step(silence()))
    assert_listen_only(await d2.step(speech()))
    frames = await d2.step(silence())
    assert [f["kind"] for f in deltas(frames)] == ["text", "audio"] and frames[0]["text"] == "Hello"
    await close_session(llama_stack, c2)


async def test_llama_omni_context_full_closes_session(llama_stack: Stack) -> None:
    """The worker closes at 8192 tokens even though the C++ server would prune on its own."""
    llama_stack.wait_free(1, timeout=20)
    c, d, _ = await open_duplex(llama_stack, "audio", {"config": {"mock_kv_per_chunk": 4000}})
    ev = assert_listen_only(await d.step(silence()))
    assert 4000 < ev["metrics"]["kv_cache_length"] < 8192
    ev = assert_listen_only(await d.step(silence()))
    assert 8000 < ev["metrics"]["kv_cache_length"] < 8192
    await c.send({"type": "input.append", "input": {"audio": silence()}})
    closed = await c.until("session.closed")
    assert closed["reason"] == "context_full"
    await c.closed(timeout=5)
    llama_stack.wait_free(1, timeout=10)
