"""The service end to end: real Redis, Celery workers, uvicorn gateways and WebSockets."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from tests.support.client import Client, decode_audio, jpeg_b64, silence, speech
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio


async def test_chat_streaming_turn(service: Stack) -> None:
    c = await Client.connect(service.url(), query="?mode=chat")
    created = await c.init()
    assert created["mode"] == "turn_based" and created["session_id"].startswith("rt_")
    await c.send(
        {
            "type": "input.append",
            "input": {
                "messages": [
                    {"role": "user", "content": "Reply with exactly: the quick brown fox"}
                ],
                "streaming": True,
            },
        }
    )
    frames = await c.collect_until("response.done")
    deltas = [f for f in frames if f["type"] == "response.output.delta"]
    assert [d["kind"] for d in deltas] == ["text"] * 4
    assert "".join(d["text"] for d in deltas) == "the quick brown fox"
    done = frames[-1]
    assert done["text"] == "the quick brown fox" and done["reason"] == "turn_end"
    assert done["response_id"] == deltas[0]["response_id"]
    # a second turn on the same connection
    await c.send(
        {
            "type": "input.append",
            "input": {"messages": [{"role": "user", "content": "Reply with exactly: again"}]},
        }
    )
    done2 = await c.until("response.done")
    assert done2["text"] == "again" and done2["response_id"] != done["response_id"]
    await c.send({"type": "session.close", "reason": "turn_done"})
    closed = await c.until("session.closed")
    assert closed["reason"] == "turn_done"


async def test_chat_non_streaming_turn_with_audio(service: Stack) -> None:
    c = await Client.connect(service.url(), query="?mode=chat")
    await c.init()
    await c.send(
        {
            "type": "input.append",
            "input": {
                "messages": [{"role": "user", "content": "Reply with exactly: only the end"}],
                "streaming": False,
                "tts": {"enabled": True},
            },
        }
    )
    frames = await c.collect_until("response.done")
    assert [f["type"] for f in frames] == ["response.done"]
    assert frames[0]["text"] == "only the end"
    audio = decode_audio(frames[0]["audio"])
    assert audio.size > 0 and audio.dtype.kind == "f"


async def test_chat_slot_released_between_turns(service: Stack) -> None:
    c = await Client.connect(service.url(), query="?mode=chat")
    await c.init()
    await c.send(
        {"type": "input.append", "input": {"messages": [{"role": "user", "content": "hi"}]}}
    )
    await c.until("response.done")
    service.wait_free(1)  # the connection is still open but holds no slot


async def test_audio_duplex_listens_then_speaks(service: Stack) -> None:
    c = await Client.connect(service.url(), query="?mode=audio")
    created = await c.init({"system_prompt": "You are helpful."})
    assert created["mode"] == "full_duplex"
    for _ in range(2):
        ev = (await c.step(silence()))[-1]
        assert ev["kind"] == "listen" and ev["text"] == ""
        assert "kv_cache_length" in ev["metrics"]
    frames = []
    for audio_in in (speech(), silence(), silence(), silence()):
        # paced (no chunk is dropped); the last step listens, after the whole response
        frames += await c.step(audio_in)
    assert frames[-1]["kind"] == "listen"
    speaking = [f for f in frames if f["type"] == "response.output.delta" and f["kind"] != "listen"]
    text = "".join(f["text"] for f in speaking if f["kind"] == "text")
    audio = [decode_audio(f["audio"]) for f in speaking if f["kind"] == "audio"]
    assert text == "Hello from the scripted backend."
    assert audio and all(a.size == 24000 for a in audio)
    assert all(f["response_id"].startswith("resp_") for f in speaking)
    assert speaking[-1]["kind"] == "audio" and speaking[-1]["metrics"]["end_of_turn"]
    await c.send({"type": "session.close", "reason": "user_stop"})
    closed = await c.until("session.closed")
    assert closed["reason"] == "user_stop"
    service.wait_free(1)


async def test_video_session_accepts_frames(service: Stack) -> None:
    c = await Client.connect(service.url())  # mode defaults to video
    await c.init({"instructions": "Describe what you see."})
    await c.send(
        {
            "type": "input.append",
            "input": {
                "audio": silence(),
                "video_frames": [jpeg_b64(), jpeg_b64((0, 0, 255))],
                "max_slice_nums": 2,
            },
        }
    )
    ev = await c.until("response.output.delta")
    assert ev["kind"] == "listen"
    assert ev["metrics"]["vision_slices"] == 4
    assert ev["metrics"]["vision_tokens"] > 0
    await c.send({"type": "session.close"})
    await c.until("session.closed")


async def test_queue_order_positions_and_leaving(service: Stack) -> None:
    url = service.url()
    a = await Client.connect(url, query="?mode=audio")
    first = await a.until("session.queue_done", "session.queued")
    assert first["type"] == "session.queue_done"
    b = await Client.connect(url, query="?mode=audio")
    qb = await b.until("session.queued")
    c = await Client.connect(url, query="?mode=audio")
    qc = await c.until("session.queued")
    d = await Client.connect(url, query="?mode=audio")
    qd = await d.until("session.queued")
    assert (qb["position"], qc["position"], qd["position"]) == (1, 2, 3)
    assert qd["queue_length"] == 3 and qd["ticket_id"].startswith("ticket_")
    assert qc["estimated_wait_s"] >= qb["estimated_wait_s"]
    # c leaves while queued: d moves up to position 2
    await c.close()
    upd = await d.until("session.queue_update")
    while upd["position"] != 2:
        upd = await d.until("session.queue_update")
    # a closes: b is admitted next, in arrival order
    await a.send({"type": "session.init", "payload": {}})
    await a.until("session.created")
    await a.send({"type": "session.close"})
    await a.until("session.closed")
    await b.until("session.queue_done", timeout=20)
    upd = await d.until("session.queue_update")
    while upd["position"] != 1:
        upd = await d.until("session.queue_update")
    await b.close()
    await d.until("session.queue_done", timeout=20)
    await d.close()


async def test_two_gateways_share_one_queue(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway()
    stack.start_gateway()
    a = await Client.connect(stack.url(0), query="?mode=audio")
    await a.until("session.queue_done")
    b = await Client.connect(stack.url(1), query="?mode=audio")
    qb = await b.until("session.queued")
    c = await Client.connect(stack.url(0), query="?mode=audio")
    qc = await c.until("session.queued")
    d = await Client.connect(stack.url(1), query="?mode=audio")
    qd = await d.until("session.queued")
    assert (qb["position"], qc["position"], qd["position"]) == (1, 2, 3)
    assert qb["queue_length"] <= qc["queue_length"] <= qd["queue_length"] == 3
    await a.close()  # abrupt disconnect frees the slot; b (other gateway) is next
    await b.until("session.queue_done", timeout=20)
    upd = await c.until("session.queue_update")
    while upd["position"] != 1:
        upd = await c.until("session.queue_update")
    for x in (b, c, d):
        await x.close()


async def test_duration_limit_closes_with_timeout(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway(OMNISERVE_AUDIO_DURATION_S="3")
    c = await Client.connect(stack.url(), query="?mode=audio")
    await c.init()
    t0 = time.monotonic()
    closed = await c.until("session.closed", timeout=15)
    assert closed["reason"] == "timeout"
    assert 2.0 <= time.monotonic() - t0 <= 8.0
    stack.wait_free(1)


async def test_chat_turn_waits_in_the_same_queue(service: Stack) -> None:
    duplex = await Client.connect(service.url(), query="?mode=audio")
    await duplex.init()
    chat = await Client.connect(service.url(), query="?mode=chat")
    await chat.init()
    await chat.send(
        {
            "type": "input.append",
            "input": {"messages": [{"role": "user", "content": "Reply with exactly: waited"}]},
        }
    )
    q = await chat.until("response.queued")  # a turn after session.init: the extension event
    assert q["position"] == 1
    await duplex.send({"type": "session.close"})
    await chat.until("response.queue_done", timeout=20)
    done = await chat.until("response.done")
    assert done["text"] == "waited"


@pytest.mark.slow
async def test_worker_death_is_noticed(stack: Stack) -> None:
    worker = stack.start_worker()
    stack.start_gateway()
    c = await Client.connect(stack.url(), query="?mode=audio")
    await c.init()
    await c.send({"type": "input.append", "input": {"audio": silence()}})
    await c.until("response.output.delta")
    worker.stop(signal.SIGKILL)
    t0 = time.monotonic()
    err = await c.until("error", timeout=20)
    assert err["error"]["code"] == "backend_error"
    closed = await c.until("session.closed", timeout=5)
    assert closed["reason"] == "backend_error"
    assert time.monotonic() - t0 < 15
    assert stack.live_slots() == 0
    # a new worker takes over the queue
    stack.start_worker()
    c2 = await Client.connect(stack.url(), query="?mode=audio")
    await c2.init()
    await c2.close()


async def test_client_disconnect_frees_slot(service: Stack) -> None:
    c = await Client.connect(service.url(), query="?mode=audio")
    await c.init()
    await c.send({"type": "input.append", "input": {"audio": silence()}})
    await c.until("response.output.delta")
    await c.close()
    service.wait_free(1, timeout=10)
    c2 = await Client.connect(service.url(), query="?mode=audio")
    await c2.init()
    await c2.close()


async def test_health_and_workers(service: Stack) -> None:
    port = service.gateways[0][1]
    health = httpx.get(f"http://127.0.0.1:{port}/health").json()
    assert health["status"] == "ok" and health["worker_slots"] == 1
    workers = httpx.get(f"http://127.0.0.1:{port}/v1/workers").json()["workers"]
    assert workers[0]["backend"]["backend"] == "scripted"
    assert "not a model" in workers[0]["backend"]["label"]
    assert "omniserve_queue_waiting" in httpx.get(f"http://127.0.0.1:{port}/metrics").text


async def test_server_shutdown_closes_sessions(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway()
    c = await Client.connect(stack.url(), query="?mode=audio")
    await c.init()
    proc, _ = stack.gateways[0]
    await asyncio.to_thread(proc.stop, signal.SIGTERM)
    closed = await c.until("session.closed", timeout=10)
    assert closed["reason"] == "server_shutdown"
    stack.wait_free(1, timeout=15)


@pytest.mark.slow
async def test_worker_shutdown_ends_sessions_and_takes_no_new_work(stack: Stack) -> None:
    worker = stack.start_worker()
    stack.start_gateway()
    c = await Client.connect(stack.url(), query="?mode=audio")
    await c.init()
    await asyncio.to_thread(worker.stop, signal.SIGTERM)
    closed = await c.until("session.closed", timeout=15)
    assert closed["reason"] == "server_shutdown"
    assert stack.free_slots() == 0 and stack.live_slots() == 0
