"""The ``openai`` SDK's realtime client (``AsyncOpenAI().realtime.connect``) works unchanged
against a real gateway and scripted worker: every server event it gets validates against the
SDK's own pydantic types."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import pytest_asyncio
import websockets

from tests.support.fault_harness import kill9
from tests.support.stack import Stack

openai = pytest.importorskip("openai")
from openai import AsyncOpenAI  # noqa: E402 - after pytest.importorskip
from openai.resources.realtime.realtime import AsyncRealtimeConnection  # noqa: E402
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent  # noqa: E402
from openai.types.realtime import RealtimeServerEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
RATE = 24_000
CHUNK_S = 0.1
REPLY = "Hello from the scripted backend."


def pcm16(seconds: float, level: float = 0.0) -> str:
    """Base64 pcm16 24 kHz: a 220 Hz tone (``level``) or silence."""
    t = np.arange(int(RATE * seconds)) / RATE
    samples = (level * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    return base64.b64encode(samples.tobytes()).decode()


TOKEN = "admin-token"


@pytest.fixture(scope="module")
def openai_service(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(redis_server)
    try:
        s.start_worker(slots=2)
        s.start_gateway(
            OMNISERVE_INPUT_MAX_PENDING="16",
            # a short idle limit: a push-to-talk client, silent between turns, outlives it
            OMNISERVE_CLIENT_IDLE_TIMEOUT_S="2",
            OMNISERVE_RECORDINGS="true",
            OMNISERVE_RECORDINGS_URL=tmp_path_factory.mktemp("store").as_uri(),
            OMNISERVE_ADMIN_TOKEN=TOKEN,
        )
        yield s
    finally:
        s.stop()


@pytest_asyncio.fixture
async def conn(openai_service: Stack) -> AsyncIterator[AsyncRealtimeConnection]:
    port = openai_service.gateways[0][1]
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test")
    async with client.realtime.connect(model="minicpm-o-4.5") as connection:
        yield connection


async def next_event(conn: AsyncRealtimeConnection, timeout: float = 30) -> Any:
    """The next server event, validated strictly by the SDK's types."""
    raw = await asyncio.wait_for(conn.recv_bytes(), timeout)
    event = SERVER_EVENT.validate_json(raw)
    assert event.event_id
    return event


async def until(conn: AsyncRealtimeConnection, kind: str, seen: list[Any] | None = None) -> Any:
    while True:
        event = await next_event(conn)
        if seen is not None:
            seen.append(event)
        if event.type == kind:
            return event
        assert event.type != "error", event


async def until_within(conn: AsyncRealtimeConnection, kind: str, seconds: float) -> Any:
    """``until`` with a deadline for the whole wait (TimeoutError when it passes)."""
    return await asyncio.wait_for(until(conn, kind), seconds)


class Speaker:
    """Streams the microphone as a client does: a spoken question, then silence, paced."""

    def __init__(self, conn: AsyncRealtimeConnection) -> None:
        self.conn = conn
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        await self.conn.input_audio_buffer.append(audio=pcm16(1.0, 0.3))
        while True:
            await self.conn.input_audio_buffer.append(audio=pcm16(CHUNK_S))
            await asyncio.sleep(CHUNK_S)

    def __enter__(self) -> Speaker:
        self.task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()


async def test_session_created_first_then_update(conn: AsyncRealtimeConnection) -> None:
    created = await next_event(conn)
    assert created.type == "session.created"
    assert created.session.type == "realtime"
    assert created.session.audio.output.format.rate == 24000
    await conn.session.update(
        session={
            "type": "realtime",
            "output_modalities": ["text"],
            "instructions": "Be brief.",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "turn_detection": {"type": "semantic_vad"},
                },
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"},
            },
            "tools": [{"type": "function", "name": "f", "parameters": {}}],
        }
    )
    updated = await until(conn, "session.updated")
    assert updated.session.output_modalities == ["text"]
    assert updated.session.instructions == "Be brief."
    assert updated.session.audio.input.turn_detection.type == "semantic_vad"
    assert updated.session.audio.output.voice == "marin"


async def test_text_turn(conn: AsyncRealtimeConnection) -> None:
    await until(conn, "session.created")
    await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
    await until(conn, "session.updated")
    await conn.conversation.item.create(
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Reply with exactly: Hi there"}],
        }
    )
    added = await until(conn, "conversation.item.added")
    assert added.item.role == "user"
    await conn.response.create(event_id="evt_resp_1")
    seen: list[Any] = []
    done = await until(conn, "response.done", seen)
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert text == "Hi there"
    kinds = [e.type for e in seen]
    assert kinds.index("response.created") < kinds.index("response.output_text.delta")
    assert "response.output_text.done" in kinds
    assert done.response.status == "completed"
    assert done.response.usage.output_tokens == 2
    assert done.response.output[0].content[0].text == "Hi there"


async def test_text_turn_answered_in_speech(conn: AsyncRealtimeConnection) -> None:
    await until(conn, "session.created")
    await conn.conversation.item.create(
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Reply with exactly: one two three"}],
        }
    )
    await conn.response.create()
    seen: list[Any] = []
    done = await until(conn, "response.done", seen)
    audio = b"".join(
        base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta"
    )
    assert audio and len(audio) % 2 == 0  # pcm16
    transcript = "".join(
        e.delta for e in seen if e.type == "response.output_audio_transcript.delta"
    )
    assert transcript == "one two three"
    assert done.response.status == "completed"


async def test_an_audio_item_is_answered(conn: AsyncRealtimeConnection) -> None:
    """``conversation.item.create`` with ``input_audio`` (pcm16 24 kHz) and ``response.create``:
    a chat turn over the spoken message."""
    await until(conn, "session.created")
    await conn.conversation.item.create(
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_audio", "audio": pcm16(1.0, 0.3)}],
        }
    )
    added = await until(conn, "conversation.item.added")
    assert added.item.content[0].type == "input_audio"
    await conn.response.create(response={"output_modalities": ["text"]})
    seen: list[Any] = []
    done = await until(conn, "response.done", seen)
    assert done.response.status == "completed"
    assert done.response.usage.input_tokens > 10  # the audio counted (1 s: 10 tokens here)
    assert "".join(e.delta for e in seen if e.type == "response.output_text.delta") == REPLY


async def test_spoken_question_answered_in_speech(
    conn: AsyncRealtimeConnection, openai_service: Stack
) -> None:
    created = await until(conn, "session.created")
    seen: list[Any] = []
    with Speaker(conn):
        done = await until(conn, "response.done", seen)
    kinds = [e.type for e in seen]
    for kind in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
    ):
        assert kind in kinds
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    audio = b"".join(
        base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta"
    )
    pcm = np.frombuffer(audio, dtype="<i2")
    assert pcm.size > RATE // 2 and np.abs(pcm).max() > 1000  # speech, not silence
    transcript = "".join(
        e.delta for e in seen if e.type == "response.output_audio_transcript.delta"
    )
    assert transcript == REPLY
    assert done.response.status == "completed"

    # truncate: only what was heard stays in the conversation
    item_id = done.response.output[0].id
    cut_ms = pcm.size * 1000 // RATE * 6 // 10
    await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=cut_ms)
    truncated = await until(conn, "conversation.item.truncated")
    assert (truncated.item_id, truncated.audio_end_ms) == (item_id, cut_ms)
    await conn.conversation.item.retrieve(item_id=item_id)
    retrieved = await until(conn, "conversation.item.retrieved")
    heard = retrieved.item.content[0].transcript
    assert heard and REPLY.startswith(heard) and len(heard) < len(REPLY)
    # what a failover or rollover would replay to the model keeps only what was heard
    history_key = openai_service.keys.session_history(created.session.id)
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        turns = json.loads(openai_service.redis().get(history_key) or b"[]")
        if turns and turns[-1]["text"] == heard:
            break
        assert asyncio.get_running_loop().time() < deadline, (
            history_key,
            openai_service.redis().keys("*history*"),
        )
        await asyncio.sleep(0.2)
    assert turns == [{"role": "assistant", "text": heard}]


async def test_push_to_talk(conn: AsyncRealtimeConnection) -> None:
    """``turn_detection: null``: the client sends its question, commits, asks for the response
    and then sends nothing; between turns it stays silent longer than the idle limit."""
    await until(conn, "session.created")
    await conn.session.update(
        session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    )
    updated = await until(conn, "session.updated")
    assert updated.session.audio.input.turn_detection is None
    for turn in range(2):
        await conn.input_audio_buffer.append(audio=pcm16(1.0, 0.3))
        await conn.input_audio_buffer.commit()
        await until(conn, "input_audio_buffer.committed")
        await conn.response.create()
        seen: list[Any] = []
        done = await until(conn, "response.done", seen)
        assert done.response.status == "completed", turn
        transcript = "".join(
            e.delta for e in seen if e.type == "response.output_audio_transcript.delta"
        )
        assert transcript == REPLY
        await asyncio.sleep(3)  # silent, beyond OMNISERVE_CLIENT_IDLE_TIMEOUT_S


async def test_the_session_is_recorded(openai_service: Stack) -> None:
    """The recording holds what the model heard and said, in the model's formats."""
    port = openai_service.gateways[0][1]
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test")
    async with client.realtime.connect(model="m") as conn:
        created = await until(conn, "session.created")
        seen: list[Any] = []
        with Speaker(conn):
            await until(conn, "response.done", seen)
    out_samples = sum(
        len(base64.b64decode(e.delta)) // 2 for e in seen if e.type == "response.output_audio.delta"
    )
    rid = created.session.id
    auth = {"Authorization": f"Bearer {TOKEN}"}
    deadline = time.monotonic() + 30
    while True:
        r = httpx.get(f"http://127.0.0.1:{port}/v1/recordings/{rid}", headers=auth)
        if r.status_code == 200 and r.json()["meta"].get("complete"):
            break
        assert time.monotonic() < deadline, r.text
        await asyncio.sleep(0.2)
    meta = r.json()["meta"]
    assert (meta["mode"], meta["endpoint"]) == ("audio", "/v1/realtime")
    assert meta["output"]["audio_samples"] == out_samples
    assert meta["input"]["audio_samples"] >= 16000  # the question, at the model's 16 kHz
    transcript = httpx.get(
        f"http://127.0.0.1:{port}/v1/recordings/{rid}/files/transcript.txt", headers=auth
    ).text
    assert REPLY in transcript


async def test_barge_in_with_response_cancel(conn: AsyncRealtimeConnection) -> None:
    await until(conn, "session.created")
    with Speaker(conn):
        first = await until(conn, "response.output_audio.delta")
        await conn.response.cancel()
        done = await until(conn, "response.done")
        assert done.response.id == first.response_id
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "client_cancelled"
        # nothing more of the cancelled response arrives
        late: list[Any] = []
        try:
            while True:
                late.append(await next_event(conn, timeout=3))
        except TimeoutError:
            pass
    assert not [e for e in late if getattr(e, "response_id", None) == first.response_id]


async def test_bad_input_gets_openai_errors(conn: AsyncRealtimeConnection) -> None:
    await until(conn, "session.created")
    await conn.send({"type": "no.such.event", "event_id": "evt_bad_1"})  # type: ignore[arg-type]
    err = await next_event(conn)
    assert err.type == "error"
    assert err.error.type == "invalid_request_error"
    assert err.error.event_id == "evt_bad_1"
    assert err.error.param == "type"

    await conn.input_audio_buffer.append(audio="not base64!", event_id="evt_bad_2")
    err = await next_event(conn)
    assert (err.error.type, err.error.event_id, err.error.param) == (
        "invalid_request_error",
        "evt_bad_2",
        "audio",
    )

    await conn.send(
        {
            "type": "session.update",
            "event_id": "evt_bad_3",
            "session": {
                "type": "realtime",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}},
            },
        }  # type: ignore[arg-type]
    )
    err = await next_event(conn)
    assert err.error.event_id == "evt_bad_3"
    assert "rate" in (err.error.param or "")

    await conn.response.cancel(event_id="evt_bad_4")
    err = await next_event(conn)
    assert (err.error.code, err.error.event_id) == ("response_cancel_not_active", "evt_bad_4")

    # the session goes on
    await conn.session.update(session={"type": "realtime", "instructions": "still here"})
    updated = await until(conn, "session.updated")
    assert updated.session.instructions == "still here"


async def test_waiting_room_shows_as_rate_limits(openai_service: Stack) -> None:
    """Both slots held by audio sessions: a third waits, told its place by
    ``rate_limits.updated``, and is served once a slot is free."""
    port = openai_service.gateways[0][1]
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test")
    holders = [client.realtime.connect(model="m") for _ in range(2)]
    conns = [await h.__aenter__() for h in holders]
    speakers = []
    for c in conns:
        await until(c, "session.created")
        speakers.append(Speaker(c).__enter__())
    for c in conns:
        await until(c, "response.created")  # both hold a slot now
    async with client.realtime.connect(model="m") as waiting:
        await until(waiting, "session.created")
        await waiting.input_audio_buffer.append(audio=pcm16(0.1))
        limits = await until(waiting, "rate_limits.updated")
        assert limits.rate_limits[0].name == "requests"
        assert limits.rate_limits[0].remaining == 0
        assert limits.rate_limits[0].limit >= 1
        with Speaker(waiting):  # its microphone streams while it waits, as a real one does
            for s in speakers:
                s.__exit__(None, None, None)
            for h in holders:
                await h.__aexit__(None, None, None)
            done = await until(waiting, "response.done")
        assert done.response.status == "completed"


async def test_a_lost_worker_is_replaced_with_what_was_heard(stack: Stack, tmp_path: Path) -> None:
    """Failover under the OpenAI protocol: the worker is killed after a truncated answer; the
    call goes on on another worker, whose model is primed with the instructions and only the
    part of the answer that was heard."""
    log = tmp_path / "prompts.jsonl"
    options = {"prompt_log": str(log), "transcript": "tell me something"}
    stack.env["OMNISERVE_BACKEND_OPTIONS"] = orjson.dumps(options).decode()
    stack.start_worker()
    stack.start_worker()
    port = stack.start_gateway()
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test")
    async with client.realtime.connect(model="m") as conn:
        created = await until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "instructions": "You are terse."})
        await until(conn, "session.updated")
        seen: list[Any] = []
        with Speaker(conn):
            done = await until(conn, "response.done", seen)
        samples = sum(
            len(base64.b64decode(e.delta)) // 2
            for e in seen
            if e.type == "response.output_audio.delta"
        )
        item_id = done.response.output[0].id
        cut_ms = samples * 1000 // RATE * 6 // 10
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=cut_ms)
        await until(conn, "conversation.item.truncated")
        await conn.conversation.item.retrieve(item_id=item_id)
        heard = (await until(conn, "conversation.item.retrieved")).item.content[0].transcript
        sid = created.session.id
        deadline = time.monotonic() + 20
        (words,) = [
            e.transcript
            for e in seen
            if e.type == "conversation.item.input_audio_transcription.completed"
        ]
        assert words == "tell me something"  # what the model heard, as the user's item
        while json.loads(stack.redis().get(stack.keys.session_history(sid)) or b"[]") != [
            {"role": "user", "text": words},
            {"role": "assistant", "text": heard},
        ]:
            assert time.monotonic() < deadline, "the worker did not apply the truncate"
            await asyncio.sleep(0.2)

        owner = stack.redis().get(stack.keys.session_claim(sid))
        kill9(int(owner.decode().rsplit("#", 1)[1]))
        # what is said while the new worker is found is lost: the user says it again
        again = None
        for _ in range(10):
            with Speaker(conn):
                try:
                    again = await until_within(conn, "response.done", 6)
                    break
                except TimeoutError:
                    continue
        assert again is not None, "no answer after the failover"
        assert again.response.status == "completed"
    first, restart = [orjson.loads(line)["prompt"] for line in log.read_bytes().splitlines()]
    assert "You are terse." in first and "You are terse." in restart
    assert heard in restart and REPLY not in restart and words in restart


async def test_the_beta_client(openai_service: Stack) -> None:
    """``client.beta.realtime`` (``OpenAI-Beta: realtime=v1``): the beta's event names and
    session fields, validated by the beta's own types."""
    beta_event: TypeAdapter[Any] = TypeAdapter(BetaServerEvent)
    port = openai_service.gateways[0][1]
    client = AsyncOpenAI(  # (the beta client takes wss:// unless told the WebSocket URL)
        base_url=f"http://127.0.0.1:{port}/v1",
        websocket_base_url=f"ws://127.0.0.1:{port}/v1",
        api_key="sk-test",
    )
    async with client.beta.realtime.connect(model="m") as conn:

        async def until_beta(kind: str, seen: list[Any]) -> Any:
            while True:
                raw = await asyncio.wait_for(conn.recv_bytes(), 30)
                event = beta_event.validate_json(raw)
                seen.append(event)
                assert event.type != "error", event
                if event.type == kind:
                    return event

        seen: list[Any] = []
        created = await until_beta("session.created", seen)
        assert created.session.input_audio_format == "pcm16"
        await conn.session.update(session={"modalities": ["text"], "instructions": "Be brief."})
        updated = await until_beta("session.updated", seen)
        assert updated.session.modalities == ["text"]
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Reply with exactly: beta works"}],
            }
        )
        await conn.response.create()
        seen = []
        await until_beta("response.done", seen)
        assert "".join(e.delta for e in seen if e.type == "response.text.delta") == "beta works"
        assert "conversation.item.created" in [e.type for e in seen]

        await conn.session.update(session={"modalities": ["text", "audio"]})
        await until_beta("session.updated", seen)
        seen = []
        with Speaker(conn):
            await until_beta("response.done", seen)
    assert any(e.type == "response.audio.delta" for e in seen)
    assert any(e.type == "response.audio_transcript.delta" for e in seen)


async def test_the_api_key_is_the_bearer_token(openai_service: Stack) -> None:
    """The SDK sends its ``api_key`` as ``Authorization: Bearer``: the right one is let in, a
    wrong one refused with an OpenAI ``error`` before the socket closes."""
    key = "sk-omniserve-test-0123456789"
    if len(openai_service.gateways) < 2:
        openai_service.start_gateway(OMNISERVE_API_KEYS=f'["{key}"]')
    port = openai_service.gateways[1][1]
    good = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
    async with good.realtime.connect(model="m") as conn:
        assert (await next_event(conn)).type == "session.created"
    bad = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-wrong")
    async with bad.realtime.connect(model="m") as conn:
        err = await next_event(conn)
        assert (err.type, err.error.type, err.error.code) == (
            "error",
            "invalid_request_error",
            "unauthorized",
        )
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await conn.recv_bytes()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
