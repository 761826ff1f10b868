"""Property-based tests: malformed frames at every state never crash a process, always get the
documented answer, and never end the session (client errors are recoverable)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.client import Client, silence
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

CLIENT_CODES = {"not_ready", "unknown_event", "missing_field", "invalid_payload"}
EVENT_TYPES = [
    "session.init",
    "session.update",
    "input.append",
    "input_audio_buffer.append",
    "response.create",
    "",
    "INPUT.APPEND",
]
FIELDS = [
    "type",
    "payload",
    "input",
    "session",
    "audio",
    "video_frames",
    "force_listen",
    "max_slice_nums",
    "hints",
    "messages",
    "system_prompt",
    "instructions",
    "voice",
    "ref_audio",
    "streaming",
    "generation",
    "content",
    "role",
    "data",
]

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["", "AAAA", "%%%", silence(0.1), "not base64!"])
)
json_value = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=12,
)
frames = st.one_of(
    st.builds(
        lambda t, body: {"type": t, **body},
        st.sampled_from(EVENT_TYPES),
        st.dictionaries(st.sampled_from(FIELDS[1:]), json_value, max_size=4),
    ),
    st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), json_value, max_size=4),
    json_value,
)


async def expect_documented_answer(c: Client, frame: Any) -> None:
    await c.send(orjson.dumps(frame).decode())
    while True:
        ev = await c.recv(10)
        if ev["type"] == "error":
            assert ev["error"]["code"] in CLIENT_CODES, ev
            assert ev["error"]["type"] == "client_error"
            return
        if (
            ev["type"] == "session.created"
            and isinstance(frame, dict)
            and frame.get("type") in ("session.init", "session.update")
        ):
            return  # the generated init happened to be valid
        if (
            ev["type"] in ("response.output.delta", "response.listen")
            and isinstance(frame, dict)
            and frame.get("type") in ("input.append", "input_audio_buffer.append")
        ):
            return  # the generated input happened to be valid (input.append takes any length)
        assert ev["type"] in ("session.queue_update", "response.output.delta", "response.listen"), (
            ev
        )


def run(coro: Any) -> None:
    asyncio.run(coro)


def fuzz_settings() -> Any:
    return settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@given(batch=st.lists(frames, min_size=1, max_size=4))
@fuzz_settings()
def test_fuzz_before_init(shared_service: Stack, batch: list[Any]) -> None:
    async def go() -> None:
        c = await Client.connect(shared_service.url(), query="?mode=video")
        await c.until("session.queue_done")
        for frame in batch:
            await expect_documented_answer(c, frame)
        if not any(f.get("type") == "session.created" for f in c.received):
            await c.send({"type": "session.init", "payload": {}})
            await c.until("session.created")
        await c.send({"type": "input.append", "input": {"audio": silence()}})
        await c.until("response.output.delta", "response.listen")
        await c.close()

    run(go())


@given(batch=st.lists(frames, min_size=1, max_size=4), dialect=st.sampled_from(["new", "old"]))
@fuzz_settings()
def test_fuzz_active_duplex(shared_service: Stack, batch: list[Any], dialect: str) -> None:
    async def go() -> None:
        c = await Client.connect(shared_service.url(), query="?mode=audio")
        await c.until("session.queue_done")
        if dialect == "new":
            await c.send({"type": "session.init", "payload": {}})
        else:
            await c.send({"type": "session.update", "session": {"instructions": "x"}})
        await c.until("session.created")
        for frame in batch:
            await expect_documented_answer(c, frame)
        await c.send({"type": "input.append", "input": {"audio": silence()}})
        await c.until("response.output.delta", "response.listen")
        await c.close()

    run(go())


@given(batch=st.lists(frames, min_size=1, max_size=4))
@fuzz_settings()
def test_fuzz_chat(shared_service: Stack, batch: list[Any]) -> None:
    async def go() -> None:
        c = await Client.connect(shared_service.url(), query="?mode=chat")
        await c.init()
        for frame in batch:
            await expect_documented_answer(c, frame)
        await c.send(
            {
                "type": "input.append",
                "input": {"messages": [{"role": "user", "content": "Reply with exactly: alive"}]},
            }
        )
        done = await c.until("response.done")
        assert done["text"] == "alive"
        await c.close()

    run(go())


@given(text=st.text(min_size=1, max_size=40).filter(lambda s: not _is_json(s)))
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_fuzz_non_json_closes_1003(shared_service: Stack, text: str) -> None:
    async def go() -> None:
        c = await Client.connect(shared_service.url(), query="?mode=audio")
        await c.until("session.queue_done")
        await c.send(text)
        assert await c.closed() == 1003

    run(go())


@given(request=json_value)
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_fuzz_legacy_chat(shared_service: Stack, request: Any) -> None:
    async def go() -> None:
        c = await Client.connect(shared_service.url(), path="/ws/chat")
        await c.send(orjson.dumps(request).decode())
        ev = await c.recv(20)
        assert ev["type"] in ("error", "prefill_done"), ev
        if ev["type"] == "error":
            assert isinstance(ev["error"], str)
            assert await c.closed() == 1000

    run(go())


def test_processes_survived(shared_service: Stack) -> None:
    """After all of the above, every gateway and worker process is still up and serving."""
    assert all(p.alive() for p, _ in shared_service.gateways)
    assert all(p.alive() for p in shared_service.workers)
    shared_service.wait_free(4, timeout=20)  # and no slot leaked


def _is_json(s: str) -> bool:
    try:
        orjson.loads(s)
        return True
    except orjson.JSONDecodeError:
        return False
