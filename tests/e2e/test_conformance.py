"""Protocol conformance: every event, field, default, error code and close code of spec/,
in both dialects, over real WebSockets against the real stack (scripted backend)."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import signal
import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from tests.support.client import Client, decode_audio, jpeg_b64, pcm_b64, silence, speech
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio


async def duplex(
    url: str, mode: str = "audio", dialect: str = "current", payload: dict | None = None
) -> tuple[Client, dict]:
    c = await Client.connect(url, query=f"?mode={mode}")
    done = await c.until("session.queue_done", timeout=30)
    assert done["type"] == "session.queue_done"
    if dialect == "current":
        await c.send({"type": "session.init", "payload": payload or {}})
    else:
        await c.send({"type": "session.update", "session": payload or {"instructions": "Hi."}})
    created = await c.until("session.created")
    return c, created


async def error_of(c: Client, event: dict | str) -> dict:
    await c.send(event)
    ev = await c.until("error")
    return ev["error"]


async def still_alive(c: Client, dialect: str = "current") -> None:
    """After client errors, the session goes on."""
    if dialect == "current":
        await c.send({"type": "input.append", "input": {"audio": silence()}})
        ev = await c.until("response.output.delta")
        assert ev["kind"] == "listen"
    else:
        await c.send({"type": "input_audio_buffer.append", "audio": silence()})
        await c.until("response.listen")


# --------------------------------------------------------------------------- connect and queue


async def test_default_mode_is_video_and_created_fields(shared_service: Stack) -> None:
    c = await Client.connect(shared_service.url())
    done = await c.until("session.queue_done")
    assert done["type"] == "session.queue_done"
    await c.send({"type": "session.init", "payload": {"system_prompt": "x"}})
    created = await c.until("session.created")
    assert created["mode"] == "full_duplex"
    assert created["session_id"].startswith("rt_")
    assert isinstance(created["metrics"], dict) and created["metrics"]["backend"] == "scripted"
    assert isinstance(created["prompt_length"], int) and created["prompt_length"] > 0
    await c.send(
        {"type": "input.append", "input": {"audio": silence(), "video_frames": [jpeg_b64()]}}
    )
    ev = await c.until("response.output.delta")
    assert ev["metrics"]["vision_slices"] == 1  # video mode, frames counted
    await c.close()


async def test_invalid_mode_is_refused(shared_service: Stack) -> None:
    c = await Client.connect(shared_service.url(), query="?mode=telepathy")
    err = await c.until("error")
    assert err["error"]["code"] == "invalid_payload"
    assert await c.closed() == 1008


async def test_sdk_style_connect_with_model_bearer_and_subprotocol(shared_service: Stack) -> None:
    c = await Client.connect(
        shared_service.url(),
        query="?mode=audio&model=minicpmo",
        subprotocols=["map.realtime"],
        additional_headers={"Authorization": "Bearer sk-test"},
    )
    assert c.ws.subprotocol == "map.realtime"
    await c.init()
    await c.close()


async def test_session_ids_unique_under_concurrency(shared_service: Stack) -> None:
    async def one() -> str:
        c = await Client.connect(shared_service.url(), query="?mode=chat")
        created = await c.init()
        await c.close()
        return created["session_id"]

    ids = await asyncio.gather(*(one() for _ in range(25)))
    assert len(set(ids)) == 25


async def test_queue_full_and_worker_busy(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway(OMNISERVE_MAX_QUEUE="1")
    a = await Client.connect(stack.url(), query="?mode=audio")
    await a.until("session.queue_done")
    b = await Client.connect(stack.url(), query="?mode=audio")
    await b.until("session.queued")
    c = await Client.connect(stack.url(), query="?mode=audio")
    err = await c.until("error")
    assert err["error"] == {"code": "queue_full", "message": "Queue full", "type": "server_error"}
    assert await c.closed() == 1013
    for x in (a, b):
        await x.close()


async def test_worker_busy_without_queue(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway(OMNISERVE_MAX_QUEUE="0")
    a = await Client.connect(stack.url(), query="?mode=audio")
    await a.until("session.queue_done")
    b = await Client.connect(stack.url(), query="?mode=audio")
    err = await b.until("error")
    assert err["error"]["code"] == "worker_busy"
    assert await b.closed() == 1013
    await a.close()


async def test_service_unavailable_without_workers(stack: Stack) -> None:
    stack.start_gateway()
    c = await Client.connect(stack.url(), query="?mode=audio")
    err = await c.until("error")
    assert err["error"]["code"] == "service_unavailable"
    assert err["error"]["type"] == "server_error"
    assert await c.closed() == 1013


async def test_not_ready_while_queued_then_session_goes_on(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway()
    a = await Client.connect(stack.url(), query="?mode=audio")
    await a.until("session.queue_done")
    b = await Client.connect(stack.url(), query="?mode=audio")
    await b.until("session.queued")
    err = await error_of(b, {"type": "input.append", "input": {"audio": silence()}})
    assert err["code"] == "not_ready" and err["type"] == "client_error"
    # an init while queued is kept and applied at admission (docs/PROTOCOL.md)
    await b.send({"type": "session.init", "payload": {}})
    await a.close()
    await b.until("session.queue_done", timeout=20)
    await b.until("session.created")
    await b.close()


async def test_close_while_queued(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway()
    a = await Client.connect(stack.url(), query="?mode=audio")
    await a.until("session.queue_done")
    b = await Client.connect(stack.url(), query="?mode=audio")
    await b.until("session.queued")
    await b.send({"type": "session.close", "reason": "user_stop"})
    closed = await b.until("session.closed")
    assert closed["reason"] == "user_stop"
    await a.close()


# --------------------------------------------------------------------------- state machine


@pytest.mark.parametrize("dialect", ["current", "older"])
async def test_input_before_created_is_not_ready(shared_service: Stack, dialect: str) -> None:
    c = await Client.connect(shared_service.url(), query="?mode=audio")
    await c.until("session.queue_done")
    event = (
        {"type": "input.append", "input": {"audio": silence()}}
        if dialect == "current"
        else {"type": "input_audio_buffer.append", "audio": silence()}
    )
    err = await error_of(c, event)
    assert err["code"] == "not_ready"
    if dialect == "current":
        await c.send({"type": "session.init", "payload": {}})
    else:
        await c.send({"type": "session.update", "session": {"instructions": "x"}})
    await c.until("session.created")
    await still_alive(c, dialect)
    await c.close()


async def test_second_init_is_rejected(shared_service: Stack) -> None:
    c, _ = await duplex(shared_service.url())
    err = await error_of(c, {"type": "session.init", "payload": {}})
    assert err["code"] == "invalid_payload"
    await still_alive(c)
    await c.close()


@pytest.mark.parametrize(
    "frame,code,field",
    [
        ({"type": "response.create"}, "unknown_event", "type"),
        ({"no_type": 1}, "missing_field", "type"),
        ({"type": 7}, "invalid_payload", "type"),
        ([1, 2, 3], "invalid_payload", "type"),
        ({"type": "input.append"}, "missing_field", "input"),
        ({"type": "input.append", "input": "abc"}, "invalid_payload", "input"),
        ({"type": "input.append", "input": {}}, "missing_field", "input.audio"),
        ({"type": "input.append", "input": {"audio": 5}}, "invalid_payload", "input.audio"),
        (
            {"type": "input.append", "input": {"audio": "%%%not-base64"}},
            "invalid_payload",
            "input.audio",
        ),
        (
            {"type": "input.append", "input": {"audio": base64.b64encode(b"\0" * 4002).decode()}},
            "invalid_payload",
            "input.audio",
        ),
        ({"type": "input.append", "input": {"audio": ""}}, "invalid_payload", "input.audio"),
        (
            {"type": "input.append", "input": {"audio": silence(), "video_frames": ["aGVsbG8="]}},
            "invalid_payload",
            "input.video_frames[0]",
        ),
        (
            {"type": "input.append", "input": {"audio": silence(), "video_frames": "x"}},
            "invalid_payload",
            "input.video_frames",
        ),
        (
            {"type": "input.append", "input": {"audio": silence(), "max_slice_nums": 0}},
            "invalid_payload",
            "input.max_slice_nums",
        ),
        (
            {"type": "input.append", "input": {"audio": silence(), "max_slice_nums": 10}},
            "invalid_payload",
            "input.max_slice_nums",
        ),
        (
            {"type": "input.append", "input": {"audio": silence(), "force_listen": "yes"}},
            "invalid_payload",
            "input.force_listen",
        ),
        (
            {
                "type": "input.append",
                "input": {"audio": silence(), "hints": {"max_slice_nums": 99}},
            },
            "invalid_payload",
            "input.hints.max_slice_nums",
        ),
        ({"type": "input_audio_buffer.append"}, "missing_field", "audio"),
        ({"type": "input_audio_buffer.append", "audio": "@@"}, "invalid_payload", "audio"),
        # spec/04's minimum (4000 samples) binds the older event only
        ({"type": "input_audio_buffer.append", "audio": silence(0.2)}, "invalid_payload", "audio"),
    ],
)
async def test_client_errors_are_answered_and_session_goes_on(
    shared_service: Stack, frame: object, code: str, field: str
) -> None:
    c, _ = await duplex(shared_service.url(), mode="video")
    err = await error_of(c, frame if not isinstance(frame, list) else "[1, 2, 3]")
    assert err["code"] == code, err
    assert err["type"] == "client_error"
    assert err["field"] == field and field.split("[")[0].split(".")[-1] in err["message"]
    await still_alive(c)
    await c.close()


async def test_invalid_jpeg_bytes(shared_service: Stack) -> None:
    c, _ = await duplex(shared_service.url(), mode="video")
    truncated = base64.b64encode(base64.b64decode(jpeg_b64())[:40]).decode()
    err = await error_of(
        c, {"type": "input.append", "input": {"audio": silence(), "video_frames": [truncated]}}
    )
    assert err["code"] == "invalid_payload" and "JPEG" in err["message"]
    await still_alive(c)
    await c.close()


@pytest.mark.parametrize(
    "event,code,field",
    [
        ({"type": "session.init"}, "missing_field", "payload"),
        ({"type": "session.init", "payload": []}, "invalid_payload", "payload"),
        (
            {"type": "session.init", "payload": {"system_prompt": 3}},
            "invalid_payload",
            "payload.system_prompt",
        ),
        (
            {"type": "session.init", "payload": {"voice": {"ref_audio_base64": "!!"}}},
            "invalid_payload",
            "payload.voice.ref_audio_base64",
        ),
        (
            {"type": "session.init", "payload": {"voice": {"ref_audio_base64": "AAAAAAA="}}},
            "invalid_payload",
            "payload.voice.ref_audio_base64",
        ),
        ({"type": "session.update"}, "missing_field", "session"),
        ({"type": "session.update", "session": {}}, "missing_field", "session.instructions"),
        (
            {"type": "session.update", "session": {"instructions": "x", "ref_audio": "#"}},
            "invalid_payload",
            "session.ref_audio",
        ),
    ],
)
async def test_init_validation(shared_service: Stack, event: dict, code: str, field: str) -> None:
    c = await Client.connect(shared_service.url(), query="?mode=audio")
    await c.until("session.queue_done")
    err = await error_of(c, event)
    assert (err["code"], err["field"]) == (code, field)
    await c.send({"type": "session.init", "payload": {}})  # a valid init still works
    await c.until("session.created")
    await c.close()


async def test_non_json_frame_closes_1003(shared_service: Stack) -> None:
    c, _ = await duplex(shared_service.url())
    await c.send("this is not json {")
    assert await c.closed() == 1003


async def test_binary_frame_closes_1003(shared_service: Stack) -> None:
    c = await Client.connect(shared_service.url(), query="?mode=audio")
    await c.until("session.queue_done")
    await c.ws.send(b"\x00\x01")
    assert await c.closed() == 1003


# --------------------------------------------------------------------------- init variants


def wav_b64(seconds: float = 0.5, rate: int = 22050) -> str:
    from omnicore.audio import wav_bytes

    t = np.arange(int(rate * seconds)) / rate
    return base64.b64encode(
        wav_bytes((0.1 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), rate)
    ).decode()


async def test_init_accepts_aliases_and_reference_audio(shared_service: Stack) -> None:
    plain, _ = await duplex(shared_service.url(), payload={"system_prompt": "one two"})
    await plain.close()
    _, created_plain = await duplex(shared_service.url(), payload={"instructions": "one two"})
    c, created = await duplex(
        shared_service.url(),
        payload={
            "instructions": "one two",
            "config": {"length_penalty": 1.1},
            "voice": {
                "ref_audio_base64": pcm_b64(np.zeros(16000, np.float32)),
                "tts_ref_audio_base64": wav_b64(),
            },
        },
    )
    # the reference voice reached the backend: the prompt grew by its length
    assert created["prompt_length"] > created_plain["prompt_length"]
    await c.close()
    c2, created2 = await duplex(
        shared_service.url(),
        dialect="older",
        payload={"instructions": "one two", "ref_audio": wav_b64(1.0, 16000)},
    )
    assert created2["prompt_length"] > created_plain["prompt_length"]
    assert set(created2) == {"type", "session_id", "prompt_length"}
    await c2.close()


# --------------------------------------------------------------------------- output, both dialects


async def test_older_dialect_full_session(shared_service: Stack) -> None:
    c, created = await duplex(shared_service.url(), dialect="older")
    assert created["session_id"].startswith("rt_")
    frames = []
    for audio in (silence(), speech(), silence(), silence(), silence()):
        frames += await c.step(audio, dialect="older")
    assert [f["type"] for f in frames] == [
        "response.listen",
        "response.listen",
        "response.output_audio.delta",
        "response.output_audio.delta",
        "response.listen",
    ]
    listen = frames[0]
    assert set(listen) == {"type", "kv_cache_length"}
    deltas = frames[2:4]
    for ev in deltas:
        assert set(ev) == {"type", "text", "audio", "end_of_turn", "kv_cache_length"}
    assert [d["end_of_turn"] for d in deltas] == [False, True]
    assert "".join(d["text"] for d in deltas) == "Hello from the scripted backend."
    assert all(decode_audio(d["audio"]).size == 24000 for d in deltas)
    kvs = [d["kv_cache_length"] for d in deltas]
    assert kvs == sorted(kvs) and kvs[0] > listen["kv_cache_length"]
    await c.send({"type": "session.close", "reason": "user_stop"})
    closed = await c.until("session.closed")
    assert closed["reason"] == "stopped"
    assert await c.closed() == 1000


async def test_current_dialect_ids_and_metrics(shared_service: Stack) -> None:
    c, _ = await duplex(shared_service.url())
    inputs = [silence(), speech(), silence(), silence(), silence()] * 2
    deltas: list[dict] = []
    for n, audio in enumerate(inputs, start=1):
        # paced: the next chunk goes only after this one's first delta, so none is dropped
        await c.send({"type": "input.append", "input": {"audio": audio}})
        while True:
            ev = await c.until("response.output.delta")
            deltas.append(ev)
            if ev["input_id"] == f"input_{n}":
                break
    responses: dict[str, list[dict]] = {}
    listen_inputs = []
    for ev in deltas:
        if ev["kind"] == "listen":
            assert ev["text"] == "" and ev["session_id"] == deltas[0]["session_id"]
            assert {"kv_cache_length", "vision_slices", "vision_tokens"} <= set(ev["metrics"])
            listen_inputs.append(ev["input_id"])
        else:
            assert ev["input_id"].startswith("input_")
            responses.setdefault(ev["response_id"], []).append(ev)
    assert len(responses) == 2  # one response_id per output turn
    assert listen_inputs == ["input_1", "input_2", "input_5", "input_6", "input_7", "input_10"]
    for response in responses.values():
        assert {"text", "audio"} <= {d["kind"] for d in response}
        assert response[-1]["metrics"]["end_of_turn"]  # only the last step ends the turn
        assert {d["input_id"] for d in response if d["metrics"]["end_of_turn"]} == {
            response[-1]["input_id"]
        }
    await c.close()


async def test_force_listen_interrupts_speech(stack: Stack) -> None:
    stack.start_worker(OMNISERVE_SCRIPTED_REPLY=" ".join(["word"] * 60))
    stack.start_gateway()
    c, _ = await duplex(stack.url())
    for audio in (speech(), silence()):
        await c.send({"type": "input.append", "input": {"audio": audio}})
    ev = await c.until("response.output.delta")
    while ev["kind"] == "listen":
        ev = await c.until("response.output.delta")
    response_id = ev["response_id"]
    await c.send({"type": "input.append", "input": {"audio": silence(), "force_listen": True}})
    # the current response ends (its last piece may follow) and the model listens
    while True:
        ev = await c.until("response.output.delta")
        if ev["kind"] == "listen":
            break
        assert ev["response_id"] == response_id
    await c.send(
        {"type": "input.append", "input": {"audio": silence(), "hints": {"force_listen": True}}}
    )
    ev = await c.until("response.output.delta")
    assert ev["kind"] == "listen"
    await c.close()


async def test_context_full_stops_the_session(stack: Stack) -> None:
    stack.start_worker(OMNISERVE_SCRIPTED_TOKENS_PER_STEP="3000", OMNISERVE_ROLLOVER="false")
    stack.start_gateway()
    c, _ = await duplex(stack.url())
    while (await c.step(silence()))[-1]["metrics"]["kv_cache_length"] < 8192:
        pass  # paced: one chunk per step, so none is dropped and the count is exact
    closed = await c.until("session.closed")
    assert closed["reason"] == "context_full"
    listens = [f for f in c.received if f.get("kind") == "listen"]
    kvs = [f["metrics"]["kv_cache_length"] for f in listens]
    assert kvs[-1] >= 8192 and all(kv < 8192 for kv in kvs[:-1])  # stopped at the limit
    stack.wait_free(1, timeout=10)


async def test_silent_drop_prefers_the_newest_chunk(stack: Stack) -> None:
    # long leases: the worker is stopped below and must not be taken for dead meanwhile
    worker = stack.start_worker(OMNISERVE_LEASE_TTL_S="60")
    stack.start_gateway(OMNISERVE_INPUT_MAX_PENDING="1", OMNISERVE_LEASE_TTL_S="60")
    c, created = await duplex(stack.url())
    await c.step(silence())  # input_1 answered: the worker waits on its streams
    key = stack.keys.input_audio(created["session_id"])
    os.killpg(worker.popen.pid, signal.SIGSTOP)  # the client now sends faster than it steps
    try:
        for _ in range(11):
            await c.send({"type": "input.append", "input": {"audio": silence()}})
        await wait_for(lambda: _last_seq(stack, key) == 12, "input_12 in the input stream")
    finally:
        os.killpg(worker.popen.pid, signal.SIGCONT)
    seen = []
    while "input_12" not in seen:
        ev = await c.until("response.output.delta", timeout=20)
        seen.append(ev["input_id"])
    # input_2 may have reached the worker's pending read before it stopped; 3..11 never did
    assert set(seen) <= {"input_2", "input_12"}
    assert not any(f["type"] == "error" for f in c.received)  # dropped silently
    assert c.received[-1]["metrics"]["dropped_chunks"] == 11 - len(seen)
    await c.close()


def _last_seq(stack: Stack, key: str) -> int:
    last = stack.redis().xrevrange(key, count=1)
    return int(last[0][1][b"seq"]) if last else 0


async def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``check`` until it holds (a generous deadline, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_inference_error_is_recoverable(stack: Stack) -> None:
    stack.start_worker(OMNISERVE_BACKEND_OPTIONS='{"fail_every": 2}')
    stack.start_gateway()
    c, _ = await duplex(stack.url())
    assert (await c.step(silence()))[-1]["kind"] == "listen"
    err = (await c.step(silence()))[-1]  # the backend fails every second step
    assert err["error"]["code"] == "inference_error"
    assert err["error"]["type"] == "server_error"
    ev = (await c.step(silence()))[-1]
    assert ev["kind"] == "listen" and ev["input_id"] == "input_3"
    await c.close()


async def test_a_chunk_lost_with_its_connection_to_redis_is_counted_dropped_and_the_session_goes_on(
    stack: Stack,
) -> None:
    """The gateway writes each chunk without waiting for Redis's answer
    (streaming/input_link.py). A chunk whose connection to Redis is lost under it may or may not
    have been taken (as in a failover), so it is not sent again; the worker sees the gap in the
    input's seq and counts it in ``metrics.dropped_chunks``, as the protocol's silent drop. Here
    the connection is killed while Redis holds the chunk unanswered (CLIENT PAUSE WRITE)."""
    stack.start_worker()
    port = stack.start_gateway()
    gateway_id = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()["gateway_id"]
    c, _ = await duplex(stack.url())
    assert (await c.step(silence()))[-1]["kind"] == "listen"
    r = stack.redis()
    r.client_pause(10_000, all=False)
    try:
        await c.send({"type": "input.append", "input": {"audio": silence()}})
        c.inputs += 1
        await asyncio.sleep(0.3)
        links = [x for x in r.client_list() if x["name"] == f"omniserve-input-{gateway_id}"]
        assert len(links) == 1, links
        r.client_kill_filter(_id=links[0]["id"])
    finally:
        r.client_unpause()
    frames = await c.step(silence())  # a fresh connection takes the next chunk
    assert not [f for f in frames if f["type"] == "error"], frames
    ev = frames[-1]
    assert ev["kind"] == "listen" and ev["input_id"] == "input_3"
    assert ev["metrics"]["dropped_chunks"] == 1, ev
    await c.close()


# --------------------------------------------------------------------------- chat mode


async def test_chat_defaults_and_errors(shared_service: Stack) -> None:
    c = await Client.connect(shared_service.url(), query="?mode=chat")
    await c.until("session.queue_done")
    err = await error_of(c, {"type": "input.append", "input": {"messages": []}})
    assert err["code"] == "not_ready"
    await c.send({"type": "session.init", "payload": {}})
    created = await c.until("session.created")
    assert created["mode"] == "turn_based"
    for bad, code, field in [
        ({"type": "input.append"}, "missing_field", "input"),
        ({"type": "input.append", "input": {}}, "missing_field", "input.messages"),
        ({"type": "input.append", "input": {"messages": []}}, "invalid_payload", "input.messages"),
        (
            {"type": "input.append", "input": {"messages": [{"role": "robot", "content": "x"}]}},
            "invalid_payload",
            "input.messages[0].role",
        ),
        (
            {
                "type": "input.append",
                "input": {
                    "messages": [
                        {"role": "user", "content": [{"type": "image", "data": "aGVsbG8="}]}
                    ]
                },
            },
            "invalid_payload",
            "input.messages[0].content[0].data",
        ),
        (
            {
                "type": "input.append",
                "input": {
                    "messages": [{"role": "user", "content": "x"}],
                    "generation": {"max_new_tokens": "many"},
                },
            },
            "invalid_payload",
            "input.generation.max_new_tokens",
        ),
    ]:
        got = await error_of(c, bad)
        assert (got["code"], got["field"]) == (code, field), got
    await c.send(
        {
            "type": "input.append",
            "input": {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "Reply with exactly: ok"}],
                    },
                ]
            },
        }
    )
    frames = await c.collect_until("response.done")
    assert not any(f.get("kind") == "audio" for f in frames)  # tts defaults to off
    done = frames[-1]
    assert done["text"] == "ok" and done["session_id"] == created["session_id"]
    assert done["metrics"]["input_tokens"] > 0
    await c.close()


async def test_chat_generation_limit(shared_service: Stack) -> None:
    c = await Client.connect(shared_service.url(), query="?mode=chat")
    await c.init()
    await c.send(
        {
            "type": "input.append",
            "input": {
                "messages": [{"role": "user", "content": "Reply with exactly: one two three four"}],
                "generation": {"max_new_tokens": 2},
                "tts": {"enabled": True},
            },
        }
    )
    frames = await c.collect_until("response.done")
    assert frames[-1]["text"] == "one two"
    assert any(f.get("kind") == "audio" for f in frames)
    await c.close()


# --------------------------------------------------------------------------- legacy /ws/chat


async def legacy(url: str, request: dict | str) -> list[dict]:
    c = await Client.connect(url, path="/ws/chat")
    await c.send(request)
    frames = []
    while True:
        try:
            ev = await c.recv(20)
        except Exception:
            break
        frames.append(ev)
        if ev["type"] in ("done", "error"):
            break
    return frames


async def test_legacy_streaming(shared_service: Stack) -> None:
    frames = await legacy(
        shared_service.url(),
        {
            "messages": [{"role": "user", "content": "Reply with exactly: legacy works"}],
            "streaming": True,
        },
    )
    types = [f["type"] for f in frames]
    assert types[0] == "prefill_done" and types[-1] == "done"
    assert isinstance(frames[0]["input_tokens"], int)
    chunks = [f for f in frames if f["type"] == "chunk"]
    assert "".join(f["text_delta"] for f in chunks) == "legacy works"
    assert any(f["audio_data"] for f in chunks)  # TTS defaults to on here
    done = frames[-1]
    assert set(done) == {
        "type",
        "text",
        "generated_tokens",
        "input_tokens",
        "audio_data",
        "recording_session_id",
    }
    assert done["text"] == "legacy works" and done["generated_tokens"] == 2
    assert done["recording_session_id"].startswith("chat_")
    # every piece of speech arrives in chunks (0.35 s + 0.3 s of tone), the final segment
    # included, as the official gateway streams it; nothing is left over for done
    streamed = sum(decode_audio(f["audio_data"]).size for f in chunks if f["audio_data"])
    assert streamed == 8400 + 7200
    assert chunks[-1]["text_delta"] == "" and chunks[-1]["audio_data"]
    assert done["audio_data"] is None


async def test_legacy_non_streaming(shared_service: Stack) -> None:
    frames = await legacy(
        shared_service.url(),
        {
            "messages": [{"role": "user", "content": "Reply with exactly: all at once"}],
            "streaming": False,
            "tts": {"enabled": False},
        },
    )
    assert [f["type"] for f in frames] == ["prefill_done", "done"]
    assert frames[-1]["text"] == "all at once" and frames[-1]["audio_data"] is None


async def test_legacy_content_types(shared_service: Stack) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (1, 2, 3)).save(buf, format="PNG")
    png = base64.b64encode(buf.getvalue()).decode()
    audio_8k = pcm_b64(np.zeros(8000, dtype=np.float32))  # 1 s at 8 kHz
    frames = await legacy(
        shared_service.url(),
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Reply with exactly: seen"},
                        {"type": "image", "data": png},
                        {"type": "audio", "data": audio_8k, "sample_rate": 8000},
                        {"type": "video", "data": tiny_video_b64(), "stack_frames": 1},
                    ],
                }
            ],
            "streaming": False,
            "tts": {"enabled": False},
            "image": {"max_slice_nums": 2},
        },
    )
    done = frames[-1]
    assert done["type"] == "done" and done["text"] == "seen", frames
    # text 4+4, image 64*2, audio resampled to 16 kHz = 10 tokens, video 64 per 1 fps frame
    assert done["input_tokens"] == 8 + 128 + 10 + 64 * 2


def tiny_video_b64() -> str:
    """A 2 s MPEG-4 clip with a 16 kHz audio track, made with PyAV."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        v = out.add_stream("mpeg4", rate=5)
        v.width, v.height, v.pix_fmt = 32, 32, "yuv420p"
        a = out.add_stream("aac", rate=16000)
        for i in range(10):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), i * 20, np.uint8), "rgb24")
            for p in v.encode(frame):
                out.mux(p)
        for p in v.encode():
            out.mux(p)
        samples = np.zeros((1, 1024), dtype=np.float32)
        for i in range(32):
            af = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
            af.sample_rate = 16000
            af.pts = i * 1024
            for p in a.encode(af):
                out.mux(p)
        for p in a.encode():
            out.mux(p)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    "request_,fragment",
    [
        ({"messages": []}, "messages"),
        ({"streaming": True}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "tts": {"mode": "karaoke"}}, "tts.mode"),
        ({"messages": [{"role": "user", "content": [{"type": "audio", "data": "AAA="}]}]}, "data"),
    ],
)
async def test_legacy_errors_then_close(
    shared_service: Stack, request_: dict, fragment: str
) -> None:
    c = await Client.connect(shared_service.url(), path="/ws/chat")
    await c.send(request_)
    ev = await c.recv()
    assert ev["type"] == "error" and fragment in ev["error"]
    assert await c.closed() == 1000


async def test_legacy_non_json_closes_1003(shared_service: Stack) -> None:
    c = await Client.connect(shared_service.url(), path="/ws/chat")
    await c.send("{{{")
    assert await c.closed() == 1003


async def test_backend_that_never_prepares(stack: Stack) -> None:
    stack.start_worker(OMNISERVE_BACKEND_OPTIONS='{"prepare_delay_s": 6}')
    stack.start_gateway(OMNISERVE_INIT_TIMEOUT_S="1")
    c = await Client.connect(stack.url(), query="?mode=audio")
    await c.until("session.queue_done")
    await c.send({"type": "session.init", "payload": {}})
    err = await c.until("error", timeout=10)
    assert err["error"]["code"] == "backend_error"
    closed = await c.until("session.closed")
    assert closed["reason"] == "backend_error"
    assert await c.closed() == 1011
    stack.wait_free(1, timeout=15)  # the worker let go once prepare returned
