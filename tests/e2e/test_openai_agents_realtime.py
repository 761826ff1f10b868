"""The OpenAI Agents SDK's realtime runner (``RealtimeRunner`` with a ``RealtimeAgent``) drives
omniserve unchanged: against a real gateway and scripted worker, a typed message and a spoken
question are answered in speech, an interrupt stops the answer, and the library validates every
server event without an error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import pytest

from tests.support.stack import Stack

pytest.importorskip("agents.realtime")
from agents import function_tool
from agents.realtime import (
    RealtimeAgent,
    RealtimeRunConfig,
    RealtimeRunner,
    RealtimeSession,
    RealtimeSessionEvent,
    RealtimeSessionModelSettings,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

RATE = 24_000
CHUNK_S = 0.1
# a long answer: 3 words a step, 1 s of speech a step (the scripted backend's defaults)
REPLY = " ".join(["one two three"] * 8)


def pcm16(seconds: float, level: float = 0.0) -> bytes:
    """Raw pcm16 24 kHz, what ``send_audio`` takes: a 220 Hz tone (``level``) or silence."""
    t = np.arange(int(RATE * seconds)) / RATE
    return (level * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city (the model has no tools: omniserve accepts and ignores it)."""
    return f"Sunny in {city}."


AGENT = RealtimeAgent(name="Assistant", instructions="Be brief.", tools=[get_weather])


@pytest.fixture(scope="module")
def agents_service(redis_server: str) -> Iterator[Stack]:
    s = Stack(redis_server)
    try:
        s.start_worker(slots=2, OMNISERVE_SCRIPTED_REPLY=REPLY)
        s.start_gateway(OMNISERVE_INPUT_MAX_PENDING="16")
        yield s
    finally:
        s.stop()


class Watcher:
    """Reads a session's events in the background, so tests can wait on the kinds they need."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.events: list[RealtimeSessionEvent] = []
        self.changed = asyncio.Condition()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        async for event in self.session:
            async with self.changed:
                self.events.append(event)
                self.changed.notify_all()

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]

    def raw(self, kind: str) -> list[dict[str, Any]]:
        """The server's (or the library's model-level) events of ``kind``, as sent."""
        out = []
        for e in self.of("raw_model_event"):
            data = e.data
            if data.type == "raw_server_event" and data.data.get("type") == kind:
                out.append(data.data)
        return out

    def errors(self) -> list[Any]:
        """Library-level trouble: error events, and server events it failed to validate."""
        bad: list[Any] = self.of("error")
        if self.task.done() and not self.task.cancelled() and self.task.exception():
            bad.append(self.task.exception())  # what the session's iterator raised
        bad += [e for e in self.of("raw_model_event") if e.data.type in ("error", "exception")]
        return bad

    async def until(self, ready: Callable[[], bool], timeout: float = 60) -> None:
        """Returns once ``ready()`` holds for the events so far."""

        async def wait() -> None:
            async with self.changed:
                await self.changed.wait_for(ready)

        await asyncio.wait_for(wait(), timeout)

    async def wait(self, kind: str, timeout: float = 60) -> Any:
        """The first session event of ``kind``, once it has come."""
        await self.until(lambda: bool(self.of(kind)), timeout)
        return self.of(kind)[0]

    async def wait_raw(self, kind: str, timeout: float = 60) -> dict[str, Any]:
        """The last server event of ``kind``, once one has come."""
        await self.until(lambda: bool(self.raw(kind)), timeout)
        return self.raw(kind)[-1]

    def audio(self) -> bytes:
        return b"".join(e.audio.data for e in self.of("audio"))


@pytest.fixture
async def watcher(agents_service: Stack, request: pytest.FixtureRequest) -> AsyncIterator[Watcher]:
    """A running ``RealtimeSession``; ``model_settings`` for the runner come as the param."""
    port = agents_service.gateways[0][1]
    settings: RealtimeSessionModelSettings = getattr(
        request, "param", RealtimeSessionModelSettings()
    )
    config: RealtimeRunConfig = {"model_settings": settings}
    runner = RealtimeRunner(starting_agent=AGENT, config=config)
    session = await runner.run(
        model_config={
            "url": f"ws://127.0.0.1:{port}/v1/realtime?model=minicpm-o-4.5",
            "api_key": "sk-test",
        }
    )
    async with session:
        w = Watcher(session)
        try:
            yield w
        finally:
            w.task.cancel()
    assert not w.errors(), w.errors()


def assistant_message(w: Watcher) -> Any:
    """The assistant's last message in the library's history (None before one)."""
    updates = w.of("history_updated")
    history = updates[-1].history if updates else []
    messages = [i for i in history if i.type == "message" and i.role == "assistant"]
    return messages[-1] if messages else None


def status(message: Any) -> str | None:
    return getattr(message, "status", None)


def assistant_transcript(w: Watcher) -> str:
    """The assistant's last message in the library's history, as its transcript or text."""
    message = assistant_message(w)
    if message is None or not message.content:
        return ""
    part = message.content[0]
    return (getattr(part, "transcript", None) or getattr(part, "text", None)) or ""


async def test_session_connects(watcher: Watcher) -> None:
    """session.created and the agent's session.update (instructions, a tool, semantic VAD) are
    accepted; omniserve answers with session.updated, which the library validates."""
    created = await watcher.wait_raw("session.created")
    assert created["session"]["type"] == "realtime"
    updated = (await watcher.wait_raw("session.updated"))["session"]
    assert updated["instructions"] == "Be brief."
    assert updated["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert not watcher.errors()


async def test_text_message_answered_in_speech(watcher: Watcher) -> None:
    await watcher.session.send_message("Reply with exactly: Hi there")
    await watcher.wait("agent_end")
    kinds = [e.type for e in watcher.events]
    assert kinds.index("agent_start") < kinds.index("audio") < kinds.index("agent_end")
    pcm = np.frombuffer(watcher.audio(), dtype="<i2")
    assert pcm.size > 0 and np.abs(pcm).max() > 1000  # speech, not silence
    await watcher.wait("audio_end")
    await watcher.until(lambda: assistant_transcript(watcher) == "Hi there", 30)
    history = watcher.of("history_updated")[-1].history
    user = [i for i in history if i.type == "message" and i.role == "user"]
    assert user and user[0].content[0].text == "Reply with exactly: Hi there"
    assert not watcher.errors()


async def test_spoken_question_answered_in_speech(watcher: Watcher) -> None:
    async def speak() -> None:
        await watcher.session.send_audio(pcm16(1.0, 0.3))
        while True:
            await watcher.session.send_audio(pcm16(CHUNK_S))
            await asyncio.sleep(CHUNK_S)

    speaker = asyncio.ensure_future(speak())
    try:
        await watcher.wait("agent_end", timeout=90)
    finally:
        speaker.cancel()
    for kind in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.committed",
        "response.created",
        "response.done",
    ):
        assert watcher.raw(kind), kind
    pcm = np.frombuffer(watcher.audio(), dtype="<i2")
    assert pcm.size >= 8 * RATE // 2 and np.abs(pcm).max() > 1000
    await watcher.until(lambda: assistant_transcript(watcher) == REPLY, 30)
    history = watcher.of("history_updated")[-1].history
    user = [i for i in history if i.type == "message" and i.role == "user"]
    assert user and user[0].content[0].type == "input_audio"  # the question, as its item
    assert not watcher.errors()


@pytest.mark.parametrize(
    "watcher",
    [
        {},  # the library's default: semantic VAD with interrupt_response, it only truncates
        {"turn_detection": {"type": "semantic_vad", "interrupt_response": False}},  # + cancel
    ],
    ids=["truncate", "truncate-and-cancel"],
    indirect=True,
)
async def test_interrupt_stops_the_audio(watcher: Watcher) -> None:
    """``session.interrupt()`` mid-answer: the library truncates the playing item (and sends
    response.cancel when the server does not cancel on interruption itself); omniserve ends
    the response as cancelled and no more of its audio comes."""
    await watcher.session.send_message("Tell me a long story.")
    await watcher.wait("audio")
    await watcher.session.interrupt()
    await watcher.wait("agent_end")
    done = watcher.raw("response.done")[-1]["response"]
    assert done["status"] == "cancelled"
    heard = len(watcher.audio())
    await asyncio.sleep(3)
    assert len(watcher.audio()) == heard  # nothing of the cancelled answer comes after
    assert heard < 8 * RATE * 2  # less than the whole answer
    assert watcher.of("audio_interrupted")
    # the library retrieves the truncated item: its history keeps it as cut short
    await watcher.wait_raw("conversation.item.retrieved")
    await watcher.until(
        lambda: getattr(assistant_message(watcher), "status", None) == "incomplete", 30
    )
    assert not watcher.errors()
