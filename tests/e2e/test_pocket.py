"""Real speech through the real stack: the pocket backend in a Celery worker behind the gateway.

A spoken question (synthesised by Piper, sent as 16 kHz chunks, one per second as a client would)
goes into an audio-duplex session; the answer's text and its audio (transcribed back with the
same Whisper model) must both mention Paris; the session's recording has the question, as heard,
as the user's line of its transcript.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from openai import AsyncOpenAI

from inference.registry import preflight
from tests.support.client import Client, decode_audio, pcm_b64
from tests.support.stack import ROOT, Stack

try:
    preflight("pocket")
except Exception as exc:
    pytest.skip(f"pocket backend not installed: {exc}", allow_module_level=True)

from inference.pocket.asr import SpeechRecognizer
from inference.pocket.assets import default_piper_voice, default_whisper_dir
from inference.pocket.tts import Speaker
from omnicore.audio import resample

pytestmark = [pytest.mark.pocket, pytest.mark.slow]

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def pocket_stack(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    store = tmp_path_factory.mktemp("recordings")
    s = Stack(redis_server)
    try:
        s.start_worker(backend="pocket")
        s.start_gateway(OMNISERVE_RECORDINGS="true", OMNISERVE_RECORDINGS_URL=str(store))
        s.env["store"] = str(store)  # for the tests' own reads (not passed to processes)
        yield s
    finally:
        s.stop()


async def transcript(stack: Stack, rid: str) -> list[tuple[str, str]]:
    """(who, text) of each line of a recording's ``transcript.txt``, once it is written."""
    folder = Path(stack.env["store"]) / rid
    deadline = time.monotonic() + 30
    while not (folder / "meta.json").exists():
        assert time.monotonic() < deadline, f"recording {rid} was not written"
        await asyncio.sleep(0.1)
    lines = (folder / "transcript.txt").read_text().splitlines()
    return [(who.split()[-1], text) for who, text in (line.split(": ", 1) for line in lines)]


@pytest.fixture(scope="module")
def question_16k() -> np.ndarray:
    speaker = Speaker(default_piper_voice())
    return resample(speaker.synthesize(QUESTION, varied=False), 24_000, 16_000).astype(np.float32)


@pytest.fixture(scope="module")
def whisper() -> SpeechRecognizer:
    return SpeechRecognizer(default_whisper_dir())


def chunks(audio: np.ndarray, silent_after: int) -> list[np.ndarray]:
    out = [audio[i : i + 16_000] for i in range(0, audio.size, 16_000)]
    out[-1] = np.pad(out[-1], (0, 16_000 - out[-1].size))
    return out + [np.zeros(16_000, dtype=np.float32)] * silent_after


async def test_spoken_question_gets_a_spoken_answer(
    pocket_stack: Stack, question_16k: np.ndarray, whisper: SpeechRecognizer
) -> None:
    c = await Client.connect(pocket_stack.url(), query="?mode=audio")
    created = await c.init({"system_prompt": ""})
    assert created["metrics"]["backend"] == "pocket"
    speaking = chunks(question_16k, silent_after=0)
    quiet = [np.zeros(16_000, dtype=np.float32)] * 14
    text, audio, listens_during_question, answered = "", [], 0, 0

    async def sender() -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i, chunk in enumerate(speaking + quiet):  # real time: one chunk per second
            await asyncio.sleep(max(0.0, t0 + i - loop.time()))
            await c.send({"type": "input.append", "input": {"audio": pcm_b64(chunk)}})

    send = asyncio.create_task(sender())
    try:
        while True:
            ev = await c.until("response.output.delta", timeout=30)
            n = int(ev["input_id"].split("_")[1]) if ev.get("input_id") else 0
            if ev["kind"] == "listen" and n <= len(speaking) and not text:
                listens_during_question += 1
            elif ev["kind"] == "text":
                text += ev["text"]
            elif ev["kind"] == "audio":
                answered = answered or n
                audio.append(decode_audio(ev["audio"]))
                if ev["metrics"].get("end_of_turn"):
                    break
    finally:
        send.cancel()
    # It listened while the question played, and answered the chunk in which the speech ended
    # (the streaming VAD finds the end inside a chunk, given 0.4 s of silence after it there).
    silence_in_last = len(speaking) - question_16k.size / 16_000
    assert answered == (len(speaking) if silence_in_last >= 0.5 else len(speaking) + 1)
    assert listens_during_question == answered - 1
    assert "paris" in text.lower(), text
    speech = np.concatenate(audio)
    assert speech.dtype == np.float32 and np.isfinite(speech).all() and speech.size > 12_000
    heard = whisper.transcribe(resample(speech, 24_000, 16_000))
    assert "paris" in heard.lower(), heard
    await c.send({"type": "session.close", "reason": "user_stop"})
    await c.until("session.closed", timeout=20)
    await c.close()
    lines = await transcript(pocket_stack, created["recording_id"])
    assert [who for who, _ in lines] == ["user", "assistant"], lines
    assert "capital of france" in lines[0][1].lower() and "paris" in lines[1][1].lower(), lines


async def test_chat_with_audio_content_and_speech(
    pocket_stack: Stack, question_16k: np.ndarray
) -> None:
    c = await Client.connect(pocket_stack.url(), query="?mode=chat")
    rid = (await c.init())["recording_id"]
    await c.send(
        {
            "type": "input.append",
            "input": {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "audio", "data": pcm_b64(question_16k), "sample_rate": 16000}
                        ],
                    }
                ],
                "streaming": True,
                "tts": {"enabled": True},
                "generation": {"max_new_tokens": 48},
            },
        }
    )
    frames = await c.collect_until("response.done", timeout=90)
    done = frames[-1]
    assert done["type"] == "response.done", frames
    assert "paris" in done["text"].lower()
    pcm = [decode_audio(f["audio"]) for f in frames if f.get("kind") == "audio"]
    assert pcm and all(p.dtype == np.float32 and np.isfinite(p).all() for p in pcm)
    assert all(
        len(base64.b64decode(f["audio"])) % 4 == 0 for f in frames if f.get("kind") == "audio"
    )
    # an image is refused clearly, never ignored
    await c.send(
        {
            "type": "input.append",
            "input": {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image", "data": _png()},
                        ],
                    }
                ]
            },
        }
    )
    err = await c.until("error", timeout=30)
    assert err["error"]["code"] == "invalid_payload" and "see" in err["error"]["message"]
    await c.close()
    # the voice message as heard, then the answer; then the refused question's own text
    lines = await transcript(pocket_stack, rid)
    assert [who for who, _ in lines] == ["user", "assistant", "user"], lines
    assert "capital of france" in lines[0][1].lower() and lines[1][1] == done["text"], lines


def _png() -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


async def test_openai_sdk_question_gets_a_spoken_answer(
    pocket_stack: Stack, question_16k: np.ndarray
) -> None:
    """The ``openai`` SDK's realtime client, push to talk (the question as pcm16 24 kHz,
    commit, ``response.create``): the model answers in speech, through the OpenAI protocol."""
    port = pocket_stack.gateways[0][1]
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test")
    pcm16 = (np.clip(resample(question_16k, 16_000, 24_000), -1, 1) * 32767).astype("<i2")
    async with client.realtime.connect(model="minicpm-o-4.5") as conn:
        event = await conn.recv()
        assert event.type == "session.created"
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm16.tobytes()).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        transcript, audio, asked = "", b"", ""
        while True:
            event = await asyncio.wait_for(conn.recv(), 120)
            assert event.type != "error", event
            if event.type == "conversation.item.input_audio_transcription.completed":
                asked = event.transcript
            elif event.type == "response.output_audio_transcript.delta":
                transcript += event.delta
            elif event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            elif event.type == "response.done":
                assert event.response.status == "completed"
                break
    assert "paris" in transcript.lower(), transcript
    assert "france" in asked.lower(), asked  # what the model heard, as the user's item
    pcm = np.frombuffer(audio, dtype="<i2")
    assert pcm.size > 12_000 and np.abs(pcm).max() > 1000


def test_worker_without_pocket_packages_refuses_to_start() -> None:
    """A worker whose install lacks a pocket package says which one, and exits non-zero."""
    code = (
        "import importlib.util as u; real = u.find_spec; "
        "u.find_spec = lambda name, *a, **k: None if name == 'piper' else real(name, *a, **k); "
        "from omniserve.cli import main; raise SystemExit(main(['worker', '--backend', 'pocket']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "piper-tts" in proc.stderr and "omniserve[pocket]" in proc.stderr
