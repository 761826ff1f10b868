"""Recordings of every session, end to end: real gateway, real scripted worker, real sockets.

The recording must hold what the client sent and what it received (audio lengths to the sample,
frames, text), be served only with the admin token, refuse ids that could leave the store, and
be pruned by age and total size.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile
from websockets.sync.client import connect

from api.recordings.spool import WavAppender
from tests.support.client import Client, decode_audio, jpeg_b64, silence, speech
from tests.support.stack import Stack

TOKEN = "rec-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def http(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.gateways[0][1]}"


def wait_recording(stack: Stack, rid: str, timeout: float = 20.0) -> dict[str, Any]:
    """The recording's API answer once the writer has committed it (it writes after the end)."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{http(stack)}/v1/recordings/{rid}", headers=AUTH)
        if r.status_code == 200:
            return dict(r.json())
        assert r.status_code == 404, r.text
        assert time.monotonic() < deadline, f"recording {rid} was not written"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def rec_stack(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    store = tmp_path_factory.mktemp("store")
    s = Stack(redis_server)
    try:
        s.start_worker(slots=2)
        s.start_gateway(
            OMNISERVE_RECORDINGS="true",
            OMNISERVE_RECORDINGS_URL=store.as_uri(),  # file:// through fsspec
            OMNISERVE_ADMIN_TOKEN=TOKEN,
        )
        s.env["store"] = str(store)  # for the tests' own checks (not passed to processes)
        yield s
    finally:
        s.stop()


async def test_duplex_recording_holds_what_was_sent_and_received(rec_stack: Stack) -> None:
    c = await Client.connect(rec_stack.url(), query="?mode=video")
    created = await c.init({"system_prompt": "be brief"})
    rid = created["recording_id"]
    assert rid == created["session_id"]
    chunks = [speech(1.0), speech(0.5), silence(1.0), silence(0.75), silence(1.0), silence(1.0)]
    frames = [jpeg_b64((10, 200, 10)), jpeg_b64((10, 10, 200))]
    for i, audio in enumerate(chunks):
        extra = {"video_frames": frames} if i == 0 else {}
        await c.step(audio, **extra)
    await c.send({"type": "session.close"})
    await c.until("session.closed")
    await c.close()
    received = [
        f for f in c.received if f["type"] == "response.output.delta" and f.get("kind") == "audio"
    ]
    out_samples = sum(decode_audio(f["audio"]).size for f in received)
    assert out_samples > 0, "the scripted backend answered the speech"
    text = "".join(
        f["text"]
        for f in c.received
        if f["type"] == "response.output.delta" and f["kind"] == "text"
    )
    in_samples = sum(decode_audio(a).size for a in chunks)

    body = wait_recording(rec_stack, rid)
    meta = body["meta"]
    assert meta["mode"] == "video" and meta["endpoint"] == "/v1/realtime"
    assert meta["close_reason"] == "user_stop" and meta["complete"] is True
    assert meta["input"]["audio_samples"] == in_samples
    assert meta["output"]["audio_samples"] == out_samples
    assert meta["input"]["frames"] == 2 and meta["dropped"] == 0
    assert (
        len(meta["workers"]) == 1 and meta["durations"]["total_s"] >= meta["durations"]["active_s"]
    )
    names = {f["name"] for f in body["files"]}
    assert {"input.wav", "output.wav", "timeline.jsonl", "transcript.txt", "meta.json"} <= names
    assert {"frame_000001.jpg", "frame_000002.jpg"} <= names

    def file(name: str) -> bytes:
        r = httpx.get(f"{http(rec_stack)}/v1/recordings/{rid}/files/{name}", headers=AUTH)
        assert r.status_code == 200, r.text
        return r.content

    pcm_in, rate_in = soundfile.read(io.BytesIO(file("input.wav")), dtype="float32")
    pcm_out, rate_out = soundfile.read(io.BytesIO(file("output.wav")), dtype="float32")
    assert (rate_in, pcm_in.size) == (16000, in_samples)
    assert (rate_out, pcm_out.size) == (24000, out_samples)
    sent = np.concatenate([decode_audio(a) for a in chunks])
    heard = np.concatenate([decode_audio(f["audio"]) for f in received])
    assert np.abs(pcm_in - sent).max() < 1e-3 and np.abs(pcm_out - heard).max() < 1e-3
    assert file("frame_000002.jpg").startswith(b"\xff\xd8")
    assert text and text.strip() in file("transcript.txt").decode()
    timeline = [json.loads(line) for line in file("timeline.jsonl").splitlines()]
    types = [e["type"] for e in timeline]
    assert types[0] == "recording.start" and types[-1] == "recording.end"
    assert "session.created" in types and "session.closed" in types and "admitted" in types
    times = [e["t"] for e in timeline]
    assert times == sorted(times)
    appended = [e for e in timeline if e["type"] == "input.append"]
    assert [e["input_wav"]["samples"] for e in appended] == [decode_audio(a).size for a in chunks]
    assert all("chars>" in e["input"]["audio"] for e in appended)  # media not inlined

    r = httpx.get(f"{http(rec_stack)}/v1/recordings/{rid}.zip", headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        assert {f"{rid}/{n}" for n in names} == set(zf.namelist())
        assert zf.read(f"{rid}/input.wav") == file("input.wav")
    same = httpx.get(f"{http(rec_stack)}/v1/recordings/{rid}?format=zip", headers=AUTH)
    assert same.status_code == 200 and same.headers["content-type"] == "application/zip"
    listing = httpx.get(f"{http(rec_stack)}/v1/recordings", headers=AUTH).json()
    assert listing["enabled"] and rid in [x["id"] for x in listing["recordings"]]
    assert listing["writer"]["written"] >= 1 and listing["writer"]["dropped"] == 0
    rec_stack.wait_free(2)  # recording holds no slot


async def test_older_dialect_and_chat_mode_are_recorded(rec_stack: Stack) -> None:
    c = await Client.connect(rec_stack.url(), query="?mode=audio")
    await c.until("session.queue_done", timeout=30)
    await c.send({"type": "session.update", "session": {"instructions": "Hi."}})
    created = await c.until("session.created")
    rid = created["recording_id"]
    for audio in (speech(1.0), silence(1.0), silence(1.0), silence(1.0)):
        await c.step(audio, dialect="older")
    # bad input: answered with its error code, noted in the recording, nothing else happens
    await c.send({"type": "input_audio_buffer.append", "audio": "%%% not base64 %%%"})
    assert (await c.until("error"))["error"]["code"] == "invalid_payload"
    await c.close()  # the client vanishes without a session.close
    heard = sum(
        decode_audio(f["audio"]).size
        for f in c.received
        if f["type"] == "response.output_audio.delta" and f["audio"]
    )
    meta = wait_recording(rec_stack, rid)["meta"]
    assert meta["dialect"] == "older" and meta["mode"] == "audio"
    assert meta["output"]["audio_samples"] == heard and meta["input"]["audio_samples"] == 64000
    assert meta["close_reason"] == "client_closed" and meta["unrecorded"] == 1
    assert meta["errors"] == ["invalid_payload"]

    chat = await Client.connect(rec_stack.url(), query="?mode=chat")
    await chat.until("session.queue_done")
    await chat.send({"type": "session.init", "payload": {}})
    created = await chat.until("session.created")
    rid = created["recording_id"]
    question = {"role": "user", "content": "Reply with exactly: recorded chat"}
    await chat.send({"type": "input.append", "input": {"messages": [question]}})
    done = await chat.until("response.done")
    await chat.send({"type": "session.close", "reason": "bye"})
    await chat.until("session.closed")
    await chat.close()
    body = wait_recording(rec_stack, rid)
    assert body["meta"]["mode"] == "chat" and body["meta"]["close_reason"] == "bye"
    transcript = httpx.get(
        f"{http(rec_stack)}/v1/recordings/{rid}/files/transcript.txt", headers=AUTH
    ).text
    assert "user: Reply with exactly: recorded chat" in transcript
    assert f"assistant: {done['text']}" in transcript


def test_legacy_chat_is_recorded_under_its_recording_session_id(rec_stack: Stack) -> None:
    request = {
        "messages": [{"role": "user", "content": "Reply with exactly: spoken answer"}],
        "tts": {"enabled": True},
    }
    with connect(f"{rec_stack.url()}/ws/chat", max_size=None) as ws:
        ws.send(json.dumps(request))
        frames = []
        while not frames or frames[-1]["type"] not in ("done", "error"):
            frames.append(json.loads(ws.recv(timeout=30)))
    done = frames[-1]
    assert done["type"] == "done", done
    heard = sum(decode_audio(f["audio_data"]).size for f in frames if f.get("audio_data"))
    meta = wait_recording(rec_stack, done["recording_session_id"])["meta"]
    assert meta["mode"] == "legacy_chat" and meta["close_reason"] == "done"
    assert meta["output"]["audio_samples"] == heard > 0


def test_the_api_needs_the_admin_token(rec_stack: Stack) -> None:
    base = http(rec_stack)
    for path in (
        "/v1/recordings",
        "/v1/recordings/rt_1",
        "/v1/recordings/rt_1.zip",
        "/v1/recordings/rt_1/files/meta.json",
    ):
        assert httpx.get(base + path).status_code == 401
        assert httpx.get(base + path, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.delete(base + "/v1/recordings/rt_1").status_code == 401
    assert httpx.get(base + "/v1/recordings", headers=AUTH).status_code == 200


def test_ids_and_names_cannot_escape_the_store(rec_stack: Stack) -> None:
    store = Path(rec_stack.env["store"])
    secret = store.parent / "secret.json"
    secret.write_text('{"secret": true}')
    (store / "meta.json").write_text('{"secret": true}')  # a file at the store's root
    base = http(rec_stack)
    for path in (
        "/v1/recordings/%2E%2E",
        "/v1/recordings/.hidden",
        "/v1/recordings/a.b",
        "/v1/recordings/%2E%2E%2Fsecret.json",
        "/v1/recordings/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "/v1/recordings/rt_1/files/%2E%2E%2Fmeta.json",
        "/v1/recordings/rt_1/files/.meta",
        "/v1/recordings/%2E%2E/files/secret.json",
        "/v1/recordings/%2E%2E.zip",
    ):
        for method in ("GET", "DELETE"):
            r = httpx.request(method, base + path, headers=AUTH)
            assert r.status_code in (400, 404, 405), (path, r.status_code)
            assert "secret" not in r.text
    assert secret.exists()


def _old_recording(store: Path, rid: str, ended_at: float, size: int) -> None:
    folder = store / rid
    folder.mkdir()
    (folder / "input.wav").write_bytes(b"\0" * size)
    meta = {"id": rid, "started_at": ended_at - 1, "ended_at": ended_at, "bytes": size}
    (folder / "meta.json").write_text(json.dumps(meta))


def test_retention_prunes_by_age_and_total_size(redis_server: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    now = time.time()
    _old_recording(store, "rt_old", now - 3 * 86400, 1000)
    _old_recording(store, "rt_recent_a", now - 600, 300_000)
    _old_recording(store, "rt_recent_b", now - 300, 499_000)  # just under the cap
    s = Stack(redis_server)
    try:
        s.start_worker()
        s.start_gateway(
            OMNISERVE_RECORDINGS="true",
            OMNISERVE_RECORDINGS_URL=str(store),
            OMNISERVE_RECORDINGS_MAX_AGE_S=str(86400),
            OMNISERVE_RECORDINGS_MAX_BYTES=str(500_000),
            OMNISERVE_RECORDINGS_PRUNE_INTERVAL_S="0.2",
        )
        deadline = time.monotonic() + 20
        while (store / "rt_old").exists() or (store / "rt_recent_a").exists():
            assert time.monotonic() < deadline, sorted(p.name for p in store.iterdir())
            time.sleep(0.1)
        assert (store / "rt_recent_b").exists()  # under the cap once the oldest went
        with connect(f"{s.url()}/ws/chat", max_size=None) as ws:
            ws.send(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
            done = {}
            while done.get("type") not in ("done", "error"):
                done = json.loads(ws.recv(timeout=30))
        rid = done["recording_session_id"]
        deadline = time.monotonic() + 20
        while not (store / rid / "meta.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # with the new recording (speech, timeline: well over 1 kB) the total passes the cap:
        # the oldest goes, the newest stays
        while (store / "rt_recent_b").exists():
            assert time.monotonic() < deadline, sorted(p.name for p in store.iterdir())
            time.sleep(0.1)
        assert (store / rid).is_dir()
        assert not [p for p in (store / ".incoming").iterdir()]  # nothing left in the spool
    finally:
        s.stop()


def test_recordings_off_by_default(service: Stack) -> None:
    with connect(f"{service.url()}/ws/chat", max_size=None) as ws:
        ws.send(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
        done = {}
        while done.get("type") not in ("done", "error"):
            done = json.loads(ws.recv(timeout=30))
    assert done["recording_session_id"].startswith("chat_")  # spec/05 names it anyway
    base = f"http://127.0.0.1:{service.gateways[0][1]}"
    assert httpx.get(base + "/v1/recordings").json() == {
        "enabled": False,
        "total": 0,
        "recordings": [],
        "writer": {"written": 0, "dropped": 0, "unstored": 0},
    }
    assert httpx.get(base + f"/v1/recordings/{done['recording_session_id']}").status_code == 404


def test_a_refused_legacy_request_is_recorded_with_its_error(rec_stack: Stack) -> None:
    with connect(f"{rec_stack.url()}/ws/chat", max_size=None) as ws:
        ws.send(json.dumps({"messages": "not a list"}))
        frame = json.loads(ws.recv(timeout=30))
    assert frame["type"] == "error"
    store = Path(rec_stack.env["store"])
    deadline = time.monotonic() + 20
    while True:  # the id was never sent (no done): find it by its error
        metas = [json.loads(p.read_text()) for p in store.glob("chat_*/meta.json")]
        refused = [m for m in metas if m["close_reason"].startswith("error: invalid_payload")]
        if refused:
            break
        assert time.monotonic() < deadline, metas
        time.sleep(0.1)
    (meta,) = refused
    assert meta["workers"] == [] and meta["durations"]["active_s"] == 0.0
    assert meta["input"]["events"] == 1 and meta["output"]["frames"] == 1


async def test_a_session_whose_worker_is_killed_is_recorded_to_its_end(
    stack: Stack, tmp_path: Path
) -> None:
    """kill -9 of the worker mid-session: the client is told, and the recording ends with the
    backend_error the client saw, its audio so far intact."""
    from tests.support.fault_harness import kill9_group

    worker = stack.start_worker()
    stack.start_gateway(OMNISERVE_RECORDINGS="true", OMNISERVE_RECORDINGS_URL=str(tmp_path))
    c = await Client.connect(stack.url(), query="?mode=audio")
    rid = (await c.init())["recording_id"]
    for audio in (speech(1.0), silence(1.0)):
        await c.step(audio)
    kill9_group(worker)
    closed = await c.until("session.closed", timeout=20)
    assert closed["reason"] == "backend_error"
    await c.close()
    deadline = time.monotonic() + 20
    while not (tmp_path / rid / "meta.json").exists():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    meta = json.loads((tmp_path / rid / "meta.json").read_text())
    assert meta["close_reason"] == "backend_error" and "backend_error" in meta["errors"]
    assert meta["input"]["audio_samples"] == 32000 and meta["complete"] is True


MALFORMED = [
    {"type": "input.append", "input": {"audio": 12}},
    {"type": "input.append", "input": {"audio": "AAAA", "video_frames": {"a": 1}}},
    {"type": "input.append", "input": {"audio": "AAAAAAA="}},  # 5 bytes: not float32
    {"type": "input.append", "input": {"audio": "", "video_frames": ["bm90IGEganBlZw=="]}},
    {"type": "input.append", "input": {"messages": [{"role": "user", "content": [None, 3]}]}},
    {"type": "input.append", "input": {"messages": [{"role": "user", "content": [
        {"type": "audio", "data": "@@@"}, {"type": "image", "data": "x"},
        {"type": "audio", "data": "AAAAAA==", "sample_rate": -5}]}]}},
    {"type": "input_audio_buffer.append", "audio": None, "video_frames": [1, None]},
    {"type": "session.init", "payload": {"system_prompt": "x" * 10_000}},
    {"type": "x" * 300, "nested": [[[[[[[[{"deep": "y" * 500}]]]]]]]]},
    {"type": "input.append", "input": "not an object"},
]  # fmt: skip


async def test_malformed_input_never_breaks_a_recording(rec_stack: Stack) -> None:
    """Whatever a client sends, the gateway answers it, the recording is written whole, and
    what could not be decoded is counted, not fatal."""
    c = await Client.connect(rec_stack.url(), query="?mode=video")
    rid = (await c.init())["recording_id"]
    for event in MALFORMED:
        await c.send(event)
        await c.until("error")
    await c.step(speech(0.5))  # the session still works
    await c.send({"type": "session.close"})
    await c.until("session.closed")
    await c.close()
    meta = wait_recording(rec_stack, rid)["meta"]
    assert meta["complete"] and meta["close_reason"] == "user_stop"
    assert meta["input"]["audio_samples"] == 8000 and meta["unrecorded"] == 4
    assert len(meta["errors"]) == len(MALFORMED)
    r = httpx.get(f"{http(rec_stack)}/v1/recordings/{rid}/files/timeline.jsonl", headers=AUTH)
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert all(len(json.dumps(x)) < 4000 for x in lines)  # long strings summarised
    rec_stack.wait_free(2)


def test_a_wav_being_written_is_a_valid_wav_after_each_flush(tmp_path: Path) -> None:
    """A recording cut short (a gateway killed mid-session) keeps the audio flushed so far
    readable: each flush leaves a header that matches the samples on disk."""
    wav = WavAppender(tmp_path / "input.wav", 16_000)
    pcm = np.linspace(-1.5, 1.5, WavAppender.FLUSH_BYTES, dtype=np.float32)  # past FLUSH_BYTES
    assert wav.append(pcm[:100]) == 0
    assert wav.append(pcm[100:]) == 100
    on_disk, rate = soundfile.read(tmp_path / "input.wav", dtype="int16")
    assert rate == 16_000 and on_disk.size == pcm.size  # flushed, not closed
    wav.append(pcm[:10])  # buffered, not flushed
    wav.close()
    whole, _ = soundfile.read(tmp_path / "input.wav", dtype="int16")
    expected = (np.clip(np.concatenate([pcm, pcm[:10]]), -1, 1) * 32767).astype(np.int16)
    assert whole.size == wav.samples == pcm.size + 10
    np.testing.assert_array_equal(whole, expected)


HEARD = "what the scripted backend heard"


def transcript_lines(folder: Path) -> list[tuple[str, str]]:
    """(who, text) of each ``transcript.txt`` line, in the file's order."""
    lines = (folder / "transcript.txt").read_text().splitlines()
    return [(who.split()[-1], text) for who, text in (line.split(": ", 1) for line in lines)]


async def test_the_transcript_holds_the_users_speech(stack: Stack, tmp_path: Path) -> None:
    """The words a backend heard (a scripted worker that reports ``HEARD`` for each utterance
    and voice message) are the user's lines of the transcript, each before the reply to it."""
    stack.start_worker(OMNISERVE_BACKEND_OPTIONS=json.dumps({"transcript": HEARD}))
    stack.start_gateway(OMNISERVE_RECORDINGS="true", OMNISERVE_RECORDINGS_URL=str(tmp_path))

    async def recorded(rid: str) -> Path:
        deadline = time.monotonic() + 20
        while not (tmp_path / rid / "meta.json").exists():
            assert time.monotonic() < deadline, f"recording {rid} was not written"
            await asyncio.sleep(0.1)
        return tmp_path / rid

    for mode in ("audio", "video"):
        c = await Client.connect(stack.url(), query=f"?mode={mode}")
        rid = (await c.init())["recording_id"]
        for _utterance in range(2):  # speech, then silence while the reply is spoken
            for audio in (speech(1.0), silence(1.0), silence(1.0), silence(1.0)):
                await c.step(audio)
        await c.send({"type": "session.close"})
        await c.until("session.closed")
        await c.close()
        replies = [
            f["metrics"]["transcript"]
            for f in c.received
            if f["type"] == "response.output.delta" and "transcript" in f["metrics"]
        ]
        assert replies and set(replies) == {HEARD}, c.received  # what the client was sent
        said = "Hello from the scripted backend."
        assert transcript_lines(await recorded(rid)) == [("user", HEARD), ("assistant", said)] * 2

    chat = await Client.connect(stack.url(), query="?mode=chat")
    rid = (await chat.init())["recording_id"]
    voice = {"role": "user", "content": [{"type": "audio", "data": speech(1.0)}]}
    text = {"role": "user", "content": "Reply with exactly: text heard"}
    answers = []
    for message in (voice, text):
        await chat.send({"type": "input.append", "input": {"messages": [message]}})
        answers.append((await chat.until("response.done"))["text"])
    await chat.send({"type": "session.close"})
    await chat.until("session.closed")
    await chat.close()
    assert transcript_lines(await recorded(rid)) == [
        ("user", HEARD),
        ("assistant", answers[0]),
        ("user", text["content"]),
        ("assistant", "text heard"),
    ]
