"""Where a field-by-field reading of spec/ finds a gateway could be stricter or looser than the
spec, over real WebSockets against real gateways and workers.

- ``input.append`` takes audio chunks of any length (spec/04's 4000-sample minimum belongs to the
  older ``input_audio_buffer.append`` only); the worker builds the model's units from them;
- every ``response.output.delta`` names the input it answers with a string ``input_id``;
- chat mode sends ``session.queued`` / ``session.queue_done`` only before ``session.init``
  (spec/01); a later turn that waits hears ``response.queued`` / ``response.queue_update`` /
  ``response.queue_done``, an extension a spec-only client ignores;
- a message over ``OMNISERVE_MAX_FRAME_BYTES`` gets an ``error`` event, then close 1009.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support.client import Client, decode_audio, pcm_b64, silence, speech
from tests.support.minicpmo_helpers import fake_minicpmo_stack
from tests.support.stack import ROOT, Stack

pytestmark = pytest.mark.asyncio


def pcm_of(samples: int) -> str:
    return pcm_b64(np.zeros(samples, dtype=np.float32))


async def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``check`` until it holds (a generous deadline, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def voice_b64() -> str:
    """A reference voice (the minicpmo stand-in speaks with it)."""
    t = np.arange(16000) / 16000
    return pcm_b64((0.1 * np.sin(2 * np.pi * 180 * t)).astype(np.float32))


@pytest.fixture(scope="module")
def minicpmo_stack(redis_server: str) -> Iterator[Stack]:
    with fake_minicpmo_stack(redis_server) as s:
        yield s


# --------------------------------------------------------------------------- chunk lengths


async def test_current_dialect_takes_short_chunks(shared_service: Stack) -> None:
    """The scripted backend steps each chunk as it comes: 1 sample, 100 ms, 249 ms all answer."""
    c = await Client.connect(shared_service.url(), query="?mode=audio")
    await c.init()
    for n, samples in enumerate([1, 1600, 3999], start=1):
        frames = await c.step(pcm_of(samples))
        assert not [f for f in frames if f["type"] == "error"], frames
        assert frames[-1]["kind"] == "listen" and frames[-1]["input_id"] == f"input_{n}"
    # the older event keeps spec/04's minimum, on the same connection
    await c.send({"type": "input_audio_buffer.append", "audio": pcm_of(3999)})
    err = (await c.until("error"))["error"]
    assert (err["code"], err["field"]) == ("invalid_payload", "audio")
    assert "minimum 4000" in err["message"]
    frames = await c.step(silence(0.05))  # and the session goes on
    assert frames[-1]["kind"] == "listen"
    await c.close()


async def test_short_chunks_are_built_into_model_units(minicpmo_stack: Stack) -> None:
    """MiniCPM-o consumes one second per step: ten 100 ms chunks are one step, answered for the
    chunk that completed it; uneven pieces (1 + 7999 + 8000 samples) make the next one."""
    minicpmo_stack.wait_free(1, timeout=20)
    c = await Client.connect(minicpmo_stack.url(), query="?mode=audio")
    try:
        await c.init({"voice": {"ref_audio_base64": voice_b64()}})
        for _ in range(10):
            await c.send({"type": "input.append", "input": {"audio": pcm_of(1600)}})
        first = await c.until("response.output.delta", "error", timeout=30)
        assert first["type"] == "response.output.delta", first
        assert (first["kind"], first["input_id"]) == ("listen", "input_10")
        for samples in (1, 7999, 8000):
            await c.send({"type": "input.append", "input": {"audio": pcm_of(samples)}})
        second = await c.until("response.output.delta", "error", timeout=30)
        assert second["type"] == "response.output.delta", second
        assert (second["kind"], second["input_id"]) == ("listen", "input_13")
        await c.send({"type": "session.close"})
        closed = await c.until("session.closed")
        assert closed["reason"] == "user_stop"
        errors = [f for f in c.received if f["type"] == "error"]
        assert not errors, errors
    finally:
        await c.close()
    minicpmo_stack.wait_free(1, timeout=20)


async def test_a_burst_of_short_chunks_keeps_two_seconds(stack: Stack) -> None:
    """The silent drop keeps OMNISERVE_INPUT_MAX_PENDING (2) seconds of audio, not 2 chunks: of
    thirty 100 ms chunks sent while the worker cannot read, the newest twenty are all stepped."""
    # long leases: the worker is stopped below and must not be taken for dead meanwhile
    worker = stack.start_worker(OMNISERVE_LEASE_TTL_S="60")
    stack.start_gateway(OMNISERVE_LEASE_TTL_S="60")
    c = await Client.connect(stack.url(), query="?mode=audio")
    created = await c.init()
    await c.step(silence(0.1))  # input_1 answered: the worker waits on its streams
    key = stack.keys.input_audio(created["session_id"])

    def last_seq() -> int:
        last = stack.redis().xrevrange(key, count=1)
        return int(last[0][1][b"seq"]) if last else 0

    os.killpg(worker.popen.pid, signal.SIGSTOP)
    try:
        for _ in range(30):
            await c.send({"type": "input.append", "input": {"audio": silence(0.1)}})
        await wait_for(lambda: last_seq() == 31, "input_31 in the input stream")
    finally:
        os.killpg(worker.popen.pid, signal.SIGCONT)
    seen: list[str] = []
    while "input_31" not in seen:
        seen.append((await c.until("response.output.delta", timeout=20))["input_id"])
    newest = {f"input_{n}" for n in range(12, 32)}
    # input_2 may have reached the worker's pending read before it stopped
    assert newest <= set(seen) <= newest | {"input_2"}, seen
    assert not [f for f in c.received if f["type"] == "error"]
    assert c.received[-1]["metrics"]["dropped_chunks"] == 30 - len(seen)
    await c.close()


# --------------------------------------------------------------------------- input_id


async def test_every_delta_names_its_input(stack: Stack) -> None:
    """1.5 s of speech per step: a response's deltas are 1 s pieces and what is left over is
    flushed as the closing piece when force_listen interrupts it; that piece names the input
    of the response's last speaking step, like the others (never null)."""
    stack.start_worker(OMNISERVE_BACKEND_OPTIONS='{"step_audio_s": 1.5}')
    stack.start_gateway()
    c = await Client.connect(stack.url(), query="?mode=audio")
    await c.init()
    await c.step(speech())
    frames = await c.step(silence())  # speech then silence: the scripted backend answers
    frames.append(await c.until("response.output.delta"))  # the audio after the text
    kinds = [(f["kind"], f["input_id"]) for f in frames if f["type"] == "response.output.delta"]
    assert kinds == [("text", "input_2"), ("audio", "input_2")], frames
    response_id = frames[-1]["response_id"]
    mark = len(c.received)
    await c.send({"type": "input.append", "input": {"audio": silence(), "force_listen": True}})
    listen = await c.until("response.output.delta")
    while listen["kind"] != "listen":
        listen = await c.until("response.output.delta")
    closing = [f for f in c.received[mark:] if f.get("response_id") == response_id]
    assert [(f["kind"], f["input_id"]) for f in closing] == [("audio", "input_2")], closing
    assert decode_audio(closing[0]["audio"]).size == 12000  # the half second left over
    usage = closing[0]["metrics"].pop("usage")  # the response's own record ends with it
    assert closing[0]["metrics"] == {"end_of_turn": True, "interrupted": True}
    assert usage["responses"] == 1 and usage["audio_out_s"] == 1.5  # 1 s, then the half second
    assert listen["input_id"] == "input_3"
    deltas = [f for f in c.received if f["type"] == "response.output.delta"]
    assert all(isinstance(f["input_id"], str) for f in deltas), deltas
    await c.close()
    stack.wait_free(1)


async def test_older_dialect_hears_error_for_an_unrecoverable_failure(stack: Stack) -> None:
    """spec/04's session.closed reasons have no backend_error: three failed steps in a row end
    an older-dialect session with reason ``error`` (the current dialect says backend_error)."""
    stack.start_worker(OMNISERVE_BACKEND_OPTIONS='{"fail_every": 1}')
    stack.start_gateway()
    for dialect, reason in (("older", "error"), ("current", "backend_error")):
        c = await Client.connect(stack.url(), query="?mode=audio")
        await c.until("session.queue_done")
        if dialect == "older":
            await c.send({"type": "session.update", "session": {"instructions": "Hi."}})
        else:
            await c.send({"type": "session.init", "payload": {}})
        await c.until("session.created")
        for _ in range(3):
            frames = await c.step(silence(), dialect=dialect)
            assert frames[-1]["error"]["code"] == "inference_error", frames
        closed = await c.until("session.closed")
        assert closed["reason"] == reason
        assert await c.closed() == 1000
        stack.wait_free(1)


# --------------------------------------------------------------------------- chat queueing


async def test_chat_turn_that_waits_hears_the_extension_events(stack: Stack) -> None:
    """spec/01: session.queued / session.queue_done come before session.init only. A later turn
    that must wait for a slot is told with response.queued / response.queue_update /
    response.queue_done, which carry the turn's response_id and input_id."""
    stack.start_worker()
    stack.start_gateway(OMNISERVE_QUEUE_UPDATE_INTERVAL_S="0.5")
    holder = await Client.connect(stack.url(), query="?mode=audio")
    await holder.init()  # the only slot is taken
    chat = await Client.connect(stack.url(), query="?mode=chat")
    created = await chat.init()
    for n in (1, 2):
        await chat.send(
            {
                "type": "input.append",
                "input": {"messages": [{"role": "user", "content": f"Reply with exactly: t{n}"}]},
            }
        )
    queued = await chat.until("response.queued")
    assert queued["position"] == 1 and queued["queue_length"] == 1
    assert queued["ticket_id"].startswith("ticket_") and queued["estimated_wait_s"] >= 0
    assert queued["session_id"] == created["session_id"] and queued["input_id"] == "input_1"
    update = await chat.until("response.queue_update")  # at least every 0.5 s while waiting
    assert update["ticket_id"] == queued["ticket_id"]
    assert update["response_id"] == queued["response_id"]
    await holder.send({"type": "session.close"})
    await holder.until("session.closed")
    frames = await chat.collect_until("response.done", timeout=20)
    frames += await chat.collect_until("response.done", timeout=20)  # the second turn
    types = [f["type"] for f in frames]
    done = frames[types.index("response.queue_done")]
    assert done["response_id"] == queued["response_id"] and done["input_id"] == "input_1"
    first, second = [f for f in frames if f["type"] == "response.done"]
    assert first["text"] == "t1" and first["response_id"] == queued["response_id"]
    assert second["text"] == "t2" and second["response_id"] != first["response_id"]
    for f in frames:
        if f["type"] == "response.output.delta":
            expected = "input_1" if f["response_id"] == first["response_id"] else "input_2"
            assert f["input_id"] == expected, f
    # after session.created no session.queue* event at all
    after_init = [f["type"] for f in chat.received[chat.received.index(created) :]]
    assert not [t for t in after_init if t.startswith("session.queue")], after_init
    await chat.close()
    await holder.close()
    stack.wait_free(1)


async def test_probe_shows_a_waiting_chat_turn(stack: Stack) -> None:
    """``omniserve probe chat`` prints the turn's place in the queue from response.queued."""
    stack.start_worker()
    stack.start_gateway()
    holder = await Client.connect(stack.url(), query="?mode=audio")
    await holder.init()  # the only slot is taken
    probe = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "omniserve",
        "probe",
        "--url",
        stack.url(),
        "chat",
        "Reply with exactly: served",
        cwd=ROOT,
        env=stack.base_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert probe.stderr is not None
        line = await asyncio.wait_for(probe.stderr.readline(), 30)
        assert line.decode().startswith("[queued: position 1,"), line
        await holder.send({"type": "session.close"})
        out, _ = await asyncio.wait_for(probe.communicate(), 30)
        assert probe.returncode == 0 and out.decode().strip() == "served"
    finally:
        if probe.returncode is None:
            probe.kill()
            await probe.wait()
        await holder.close()


# --------------------------------------------------------------------------- message size

LIMIT = 1024 * 1024  # OMNISERVE_MAX_FRAME_BYTES for these tests (the default is 128 MiB)


def append_of_size(size: int) -> str:
    """An ``input.append`` text frame of exactly ``size`` bytes (silence, then padding)."""
    head = '{"type": "input.append", "input": {"audio": "'
    event = head + silence(1.0) + '"}, "pad": "'
    return event + "x" * (size - len(event) - 2) + '"}'


async def send_too_big(c: Client, event: dict[str, Any] | str) -> None:
    """Send a message over the limit. The gateway may close before the client has written all
    of it (its send then fails, as a real client's would); its error is read after that."""
    with contextlib.suppress(ConnectionClosed):
        await c.send(event)


@pytest.mark.parametrize("deflate", ["false", "true"])
async def test_oversized_message_gets_an_error_then_close_1009(stack: Stack, deflate: str) -> None:
    """(With permessage-deflate the error event is compressed like any other message.)"""
    stack.start_worker()
    stack.start_gateway(OMNISERVE_MAX_FRAME_BYTES=str(LIMIT), OMNISERVE_WS_DEFLATE=deflate)
    c = await Client.connect(stack.url(), query="?mode=audio")
    assert bool(c.ws.protocol.extensions) == (deflate == "true")
    await c.init()
    await c.send(append_of_size(LIMIT))  # at the limit: an ordinary input
    ev = await c.until("response.output.delta")
    assert ev["input_id"] == "input_1"
    await send_too_big(c, append_of_size(LIMIT + 1))
    err = await c.until("error")
    assert err["error"]["code"] == "invalid_payload"
    assert err["error"]["type"] == "client_error"
    assert "message too big" in err["error"]["message"] and "1 MiB" in err["error"]["message"]
    assert await c.closed() == 1009
    metrics = httpx.get(f"http://127.0.0.1:{stack.gateways[0][1]}/metrics", timeout=10).text
    assert 'omniserve_errors_total{code="invalid_payload"} 1.0' in metrics  # counted like any
    stack.wait_free(1)  # the session ended and its worker slot came back
    again = await Client.connect(stack.url(), query="?mode=audio")
    await again.init()
    await again.close()


async def test_oversized_legacy_request_gets_its_string_error_then_close_1009(
    stack: Stack,
) -> None:
    stack.start_worker()
    stack.start_gateway(OMNISERVE_MAX_FRAME_BYTES=str(LIMIT))
    c = await Client.connect(stack.url(), path="/ws/chat")
    big = "x" * LIMIT
    await send_too_big(c, {"messages": [{"role": "user", "content": big}]})
    ev = await c.recv()
    assert ev["type"] == "error" and ev["error"].startswith("message too big"), ev
    assert await c.closed() == 1009
