"""The official demo's pages on ``/v1/realtime``, with real processes.

The pages send ``session.update`` ~100 ms after connecting whether or not they had to wait, send
``client_diagnostic`` events about their playback, and name settings the way the official
gateway does (``voice_config``, ``session.max_slice_nums``). Each test drives a real gateway and
a real scripted worker the way those pages do and checks what the client sees.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest

from tests.support.client import Client, jpeg_b64, silence
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio

TOKENS_PER_STEP = 16  # scripted backend defaults (inference/scripted.py)
VISION_TOKENS_PER_SLICE = 64
PROMPT_BASE = 16  # scripted prompt length: 16 + words of the system prompt


def update(instructions: str, **session: Any) -> dict[str, Any]:
    return {"type": "session.update", "session": {"instructions": instructions, **session}}


async def occupy(stack: Stack) -> Client:
    """A first user holding the only slot (an active audio session)."""
    first = await Client.connect(stack.url(), query="?mode=audio")
    await first.init()
    return first


async def queued(stack: Stack) -> Client:
    """A second user, waiting in the queue."""
    second = await Client.connect(stack.url(), query="?mode=audio")
    assert (await second.recv())["type"] == "session.queued"
    return second


async def quiet(client: Client, seconds: float) -> list[dict[str, Any]]:
    """Every frame that arrives within ``seconds`` (queue updates included)."""
    frames = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            frames.append(await client.recv(left))
        except TimeoutError:
            break
    return frames


async def metric(stack: Stack, name: str) -> float:
    async with httpx.AsyncClient() as http:
        r = await http.get(f"http://127.0.0.1:{stack.gateways[0][1]}/metrics")
    r.raise_for_status()
    match = re.search(rf"^{name} ([0-9.e+]+)$", r.text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


async def test_update_sent_while_queued_is_applied_at_admission(service: Stack) -> None:
    first = await occupy(service)
    second = await queued(service)
    # the page's update, then a second one: one pending configuration, the latest wins
    await second.send(update("one two"))
    latest = update("a b c d e", voice_config={"length_penalty": 1.05}, max_slice_nums=3)
    await second.send(latest)
    # input before the session exists keeps its documented answer, and the wait goes on
    await second.send({"type": "input_audio_buffer.append", "audio": silence()})
    frames = await quiet(second, 1.5)
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["error"]["code"] for e in errors] == ["not_ready"]
    assert {f["type"] for f in frames} <= {"error", "session.queue_update"}

    await first.close()
    assert (await second.until("session.queue_done", timeout=30))["type"]
    created = await second.until("session.created", "error", timeout=30)
    assert created["type"] == "session.created"
    assert created["prompt_length"] == PROMPT_BASE + 5  # the latest update's prompt
    assert "mode" not in created  # older dialect: the page's session.update chose it

    # session.max_slice_nums is this session's default for its inputs
    step = await second.step(silence(), dialect="older", video_frames=[jpeg_b64()])
    (listen,) = [f for f in step if f["type"] == "response.listen"]
    want = PROMPT_BASE + 5 + TOKENS_PER_STEP + VISION_TOKENS_PER_SLICE * 3
    assert listen["kv_cache_length"] == want
    await second.send({"type": "session.close"})
    assert (await second.until("session.closed"))["reason"] == "stopped"
    service.wait_free(1)


async def test_invalid_update_while_queued_is_answered_at_once_and_not_kept(
    service: Stack,
) -> None:
    first = await occupy(service)
    second = await queued(service)
    await second.send(update("keep me"))
    await second.send({"type": "session.update", "session": {"ref_audio": "x"}})
    err = await second.until("error")
    assert err["error"]["code"] == "missing_field"
    assert err["error"]["field"] == "session.instructions"
    await first.close()
    created = await second.until("session.created", "error", timeout=30)
    assert created["type"] == "session.created"
    assert created["prompt_length"] == PROMPT_BASE + 2  # the valid one was kept
    await second.close()
    service.wait_free(1)


async def test_voice_config_reaches_the_backend(service: Stack) -> None:
    """A bad voice_config value is refused by the backend (as MiniCPM-o refuses it), even when
    the update waited in the queue; the page may then send a corrected one."""
    first = await occupy(service)
    second = await queued(service)
    await second.send(update("hi", voice_config={"length_penalty": "long"}))
    await first.close()
    await second.until("session.queue_done", timeout=30)
    err = await second.until("error", "session.created", timeout=30)
    assert err["type"] == "error" and err["error"]["code"] == "invalid_payload"
    assert err["error"]["field"] == "config.length_penalty"
    await second.send(update("hi", voice_config={"length_penalty": 1.2}))
    created = await second.until("session.created", "error")
    assert created["type"] == "session.created"
    await second.close()
    service.wait_free(1)


@pytest.mark.parametrize(
    "session,code,field",
    [
        ({"voice_config": [1]}, "invalid_payload", "session.voice_config"),
        ({"max_slice_nums": 10}, "invalid_payload", "session.max_slice_nums"),
        ({"max_slice_nums": "2"}, "invalid_payload", "session.max_slice_nums"),
    ],
)
async def test_bad_official_fields_are_refused(
    shared_service: Stack, session: dict[str, Any], code: str, field: str
) -> None:
    c = await Client.connect(shared_service.url(), query="?mode=audio")
    await c.until("session.queue_done", timeout=30)
    await c.send(update("x", **session))
    err = await c.until("error")
    assert (err["error"]["code"], err["error"]["field"]) == (code, field)
    await c.send(update("x"))  # the session goes on
    assert (await c.until("session.created"))["type"] == "session.created"
    await c.close()


async def test_client_diagnostic_is_accepted_logged_and_counted(stack: Stack) -> None:
    stack.start_worker()
    stack.start_gateway()
    gaps_before = await metric(stack, "omniserve_client_playback_gaps_total")
    first = await occupy(stack)
    second = await queued(stack)
    diag = {"type": "client_diagnostic", "ts": 12.5, "session_elapsed_s": 3.0}
    await second.send({**diag, "event": "gap", "gap_ms": 120, "gap_idx": 0})  # while queued
    await first.close()
    await second.until("session.queue_done", timeout=30)
    await second.send({**diag, "event": "gap", "gap_ms": 80, "gap_idx": 1})  # before init
    await second.send(update("hi"))
    created = await second.until("session.created", "error", timeout=30)
    assert created["type"] == "session.created"
    assert "mode" not in created  # a diagnostic first does not choose the dialect
    await second.send({**diag, "event": "gap", "gap_ms": 40, "gap_idx": 2, "recent": [1, 2]})
    await second.send({**diag, "event": "session_summary", "total_gaps": 3})
    await second.send({"type": "client_diagnostic"})  # no fields at all
    await second.send({"type": "session.close"})
    frames = await second.collect_until("session.closed")
    assert not [f for f in frames + second.received if f["type"] == "error"]
    assert await metric(stack, "omniserve_client_playback_gaps_total") == gaps_before + 3

    log = stack.gateways[0][0].log.read_text()
    sid = created["session_id"]
    assert len(re.findall(rf"client_diagnostic session={sid} event=gap ", log)) == 3
    assert f"client_diagnostic session={sid} event=session_summary" in log
