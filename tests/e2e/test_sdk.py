"""The public Python SDK ``openbmb-realtime`` works against our server unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.client import jpeg_b64
from tests.support.stack import Stack

openbmb_realtime = pytest.importorskip("openbmb_realtime")
from openbmb_realtime import (  # noqa: E402 - after pytest.importorskip
    AudioDelta,
    RealtimeClient,
    SessionClosed,
    TextDelta,
    TurnCompleted,
)


def tone(seconds: float = 1.0, level: float = 0.2) -> bytes:
    t = np.arange(int(16000 * seconds)) / 16000
    return (level * np.sin(2 * np.pi * 220 * t)).astype("<f4").tobytes()


def quiet(seconds: float = 1.0) -> bytes:
    return np.zeros(int(16000 * seconds), dtype="<f4").tobytes()


async def converse(session, send) -> tuple[str, int, int]:
    """Speak, then stay quiet; gather the SDK's events until the answer's turn completes."""
    events = session.events()
    text, audio_bytes, turns = "", 0, 0
    for chunk in (quiet(), tone(), quiet(), quiet(), quiet(), quiet()):
        await send(chunk)
    while True:
        ev = await asyncio.wait_for(events.__anext__(), 20)
        if isinstance(ev, TextDelta):
            text += ev.text
        elif isinstance(ev, AudioDelta):
            audio_bytes += len(ev.audio)
        elif isinstance(ev, TurnCompleted):
            turns += 1
            if text:
                return text, audio_bytes, turns
        elif isinstance(ev, SessionClosed):
            pytest.fail(f"closed early: {ev}")


@pytest.fixture(scope="module")
def sdk_service(redis_server: str) -> Iterator[Stack]:
    """A gateway that keeps every pending input chunk: the SDK sends a burst of six, and this
    test is about the SDK, not about the silent drop (tests/e2e/test_conformance.py covers that)."""
    s = Stack(redis_server)
    try:
        s.start_worker(slots=2)
        s.start_gateway(OMNISERVE_INPUT_MAX_PENDING="16")
        yield s
    finally:
        s.stop()


async def test_sdk_audio_session(sdk_service: Stack) -> None:
    port = sdk_service.gateways[0][1]
    client = RealtimeClient(api_key="sk-test", base_url=f"http://127.0.0.1:{port}")
    session = await client.audio.connect(model="minicpm-o-4.5", system_prompt="Be helpful.")
    assert session.id.startswith("rt_")
    text, audio_bytes, turns = await converse(session, session.send_audio)
    assert text == "Hello from the scripted backend."
    assert audio_bytes > 0 and audio_bytes % 4 == 0
    assert turns >= 2  # listen deltas (text "") mark turn ends for the SDK
    session.interrupt()
    await session.send_audio(quiet())
    await session.close()
    assert session.state.value == "closed"


async def test_sdk_video_session(sdk_service: Stack) -> None:
    import base64

    port = sdk_service.gateways[0][1]
    client = RealtimeClient(api_key="sk-test", base_url=f"http://127.0.0.1:{port}/v1")
    session = await client.video.connect(model="minicpm-o-4.5", max_slice_nums=2)
    frame = base64.b64decode(jpeg_b64())

    async def send(chunk: bytes) -> None:
        await session.send_audio_video(chunk, frame)

    text, audio_bytes, _ = await converse(session, send)
    assert text and audio_bytes > 0
    await session.close()
