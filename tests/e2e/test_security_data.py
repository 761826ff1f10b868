"""What a client's data may reach: server files (voices) and Celery task arguments.

Real gateway and worker processes on loopback. The voices directory is checked at the gateway
and resolved again on the worker, where the file is read; the Celery capture is a real event
receiver (what Flower reads) on the run's Redis.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnicore.audio import pcm_to_b64, wav_bytes, write_wav
from tests.support.celery_events import TaskEvents
from tests.support.client import Client, jpeg_b64, speech
from tests.support.fault_harness import await_for
from tests.support.stack import Stack

pytestmark = pytest.mark.asyncio

TONE = np.full(1600, 0.1, dtype=np.float32)


def voices_dir(root: Path, outside: Path, escaping: tuple[str, ...] = ()) -> Path:
    """A voices directory with ``alice.wav``, ``en/bob.wav`` and symlinks pointing out."""
    (root / "en").mkdir(parents=True)
    write_wav(root / "alice.wav", TONE, 16_000)
    for name in ("en/bob.wav", *escaping):
        if name not in escaping:
            write_wav(root / name, TONE, 16_000)
    for name in escaping:
        (root / name).symlink_to(outside)
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.wav"
    write_wav(secret, TONE, 16_000)
    return secret


def turn(voice: str | None, **tts: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Reply with exactly: voiced"}],
        "streaming": False,
        "tts": {"enabled": True, **({"ref_audio_path": voice} if voice is not None else {}), **tts},
    }


async def chat_turn(url: str, request: dict[str, Any]) -> dict[str, Any]:
    """One /v1/realtime chat turn: its ``response.done`` or its ``error``."""
    c = await Client.connect(url, query="?mode=chat")
    try:
        await c.init()
        await c.send({"type": "input.append", "input": request})
        return await c.until("response.done", "error", timeout=30)
    finally:
        await c.close()


async def legacy_turn(url: str, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """One /ws/chat request: its ``done`` or ``error`` frame and the close code."""
    c = await Client.connect(url, path="/ws/chat")
    await c.send(request)
    frame = await c.until("done", "error", timeout=30)
    return frame, await c.closed()


ESCAPES = [
    "../secret.wav",
    "en/../../secret.wav",
    "/etc/passwd",
    "%2e%2e/secret.wav",
    "..\\secret.wav",
    "\uff0e\uff0e/secret.wav",
    "alice.wav\x00",
    "out.wav",  # a symlink in the directory pointing outside
    "missing.wav",
    "",
]


async def test_voice_paths_stay_in_the_voices_directory(
    stack: Stack, tmp_path: Path, outside: Path
) -> None:
    gateway_voices = voices_dir(tmp_path / "gw", outside, escaping=("out.wav",))
    # the worker's copy differs: there en/bob.wav leads out (the gateway's check cannot see it)
    worker_voices = voices_dir(tmp_path / "wk", outside, escaping=("out.wav", "en/bob.wav"))
    stack.start_worker(OMNISERVE_VOICES_DIR=str(worker_voices))
    stack.start_gateway(OMNISERVE_VOICES_DIR=str(gateway_voices))
    stack.start_gateway()  # no voices directory at all
    url, no_voices = stack.url(0), stack.url(1)

    done = await chat_turn(url, turn("alice.wav"))
    assert done["type"] == "response.done" and done["text"] == "voiced", done
    frame, close = await legacy_turn(url, turn("alice.wav"))
    assert frame["type"] == "done" and close == 1000, frame

    for name in ESCAPES:
        err = await chat_turn(url, turn(name))
        assert err["type"] == "error", (name, err)
        assert err["error"]["code"] == "invalid_payload", (name, err)
        assert err["error"]["field"] == "input.tts.ref_audio_path", (name, err)
        assert str(tmp_path) not in err["error"]["message"]
        frame, close = await legacy_turn(url, turn(name))
        assert frame["type"] == "error" and close == 1000, (name, frame)
        assert frame["error"].startswith("invalid_payload: request.tts.ref_audio_path"), frame

    # passed the gateway, refused by the worker where the file would be read
    err = await chat_turn(url, turn("en/bob.wav"))
    assert err["type"] == "error" and err["error"]["code"] == "invalid_payload", err
    assert err["error"]["field"] == "tts.ref_audio_path", err
    assert "no such voice" in err["error"]["message"]

    # no OMNISERVE_VOICES_DIR: the field is refused, whatever it names
    err = await chat_turn(no_voices, turn("alice.wav"))
    assert err["type"] == "error" and err["error"]["code"] == "invalid_payload", err
    assert "not enabled" in err["error"]["message"]
    # inline voices need no directory
    done = await chat_turn(no_voices, turn(None, ref_audio_data=pcm_to_b64(TONE)))
    assert done["type"] == "response.done", done


# --------------------------------------------------------------------------- Celery arguments


async def test_task_arguments_carry_no_prompt_or_media(
    stack: Stack, task_events: TaskEvents
) -> None:
    stack.start_worker()
    stack.start_gateway()
    # the receiver hears the worker (heartbeats every 2 s): it is subscribed
    assert await asyncio.to_thread(task_events.heard_worker.wait, 30)
    marker = uuid.uuid4().hex
    image = jpeg_b64((10, 200, 30))
    audio = pcm_to_b64(np.linspace(-0.5, 0.5, 16_000, dtype=np.float32))
    voice = base64.b64encode(wav_bytes(TONE, 16_000)).decode()
    video = base64.b64encode(b"\x00\x00\x00\x18ftypmp42" + marker.encode()).decode()
    prompt = f"PROMPT-{marker} Reply with exactly: fine"
    request = {
        "messages": [
            {"role": "system", "content": f"SYSTEM-{marker}"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": prompt},
                    {"type": "image", "data": image},
                    {"type": "audio", "data": audio},
                ],
            },
        ],
        "tts": {"enabled": True, "ref_audio_data": voice},
    }
    done = await chat_turn(stack.url(), request)
    assert done["type"] == "response.done" and done["text"] == "fine", done
    frame, _ = await legacy_turn(stack.url(), {**request, "streaming": False})
    assert frame["type"] == "done", frame
    # a turn the worker refuses (undecodable video) still went through the same path
    bad_video = {"messages": [{"role": "user", "content": [{"type": "video", "data": video}]}]}
    err = await chat_turn(stack.url(), bad_video)
    assert err["type"] == "error", err
    duplex = await Client.connect(stack.url(), query="?mode=audio")
    await duplex.init({"system_prompt": f"DUPLEX-{marker}", "voice": {"ref_audio_base64": voice}})
    await duplex.step(speech(1.0))
    await duplex.send({"type": "session.close"})
    await duplex.until("session.closed")
    await duplex.close()

    chat, session = "omniserve.chat_turn", "omniserve.duplex_session"
    await await_for(lambda: len(task_events.of_type("task-succeeded", chat)) >= 3, 30, "chat turns")
    await await_for(lambda: task_events.of_type("task-succeeded", session), 30, "duplex session")
    received = task_events.of_type("task-received")
    assert {e["name"] for e in received} == {chat, session}
    secrets = [marker, image[:24], audio[:24], voice[:24], video[:24], "You said", "Reply with"]
    for event in task_events.events:
        shown = f"{event.get('args', '')} {event.get('kwargs', '')}"
        for secret in secrets:
            assert secret not in shown, (event["type"], secret)
    # what the arguments do carry: ids, the slot, the deadline
    for e in received:
        assert e["args"] == "()"
        assert "slot_id" in e["kwargs"] and "deadline_ts" in e["kwargs"], e["kwargs"]
        assert len(e["kwargs"]) < 300, e["kwargs"]
