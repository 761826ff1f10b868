"""The llama_omni backend against the mock llama-omni-server (a real server on 127.0.0.1)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from inference import (  # noqa: E402 - after the sys.path entry above
    AudioPart,
    BackendError,
    ChatDelta,
    ChatDone,
    ChatPrefilled,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    GenerationConfig,
    ImagePart,
    InferenceError,
    Message,
    TextPart,
    TTSConfig,
    UnsupportedInput,
    VideoPart,
    create_backend,
)
from inference.llama_omni import LlamaOmniSessionClosed, protocol  # noqa: E402
from tests.support.standins.mock_llama_omni_server import SPEECH, RunningServer  # noqa: E402

MOCK_SERVER = "tests.support.standins.mock_llama_omni_server"


@pytest.fixture()
def server():
    with RunningServer() as srv:
        yield srv


def make_backend(server, **opts):
    return create_backend("llama_omni", backend_url=server.url, **opts)


def loud():
    t = np.arange(16000, dtype=np.float32) / 16000
    return (0.5 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def quiet():
    return np.zeros(16000, dtype=np.float32)


def user(text, *parts):
    return Message(role="user", content=[TextPart(text), *parts])


def wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def frames_sent(server, kind):
    return [m for m in server.mock.history if m.get("type") == kind]


# ---------------------------------------------------------------- construction


def test_urls():
    b = create_backend("llama_omni", backend_url="http://127.0.0.1:22500")
    assert b.ws_url == "ws://127.0.0.1:22500/backend" and b.http_url == "http://127.0.0.1:22500"
    b = create_backend("llama_omni", backend_url="ws://h:1/backend")
    assert b.ws_url == "ws://h:1/backend" and b.http_url == "http://h:1"
    with pytest.raises(ValueError):
        create_backend("llama_omni", backend_url="ftp://x")


def test_unreachable_server_is_backend_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = create_backend("llama_omni", backend_url=f"http://127.0.0.1:{port}", connect_timeout_s=2)
    with pytest.raises(BackendError):
        b.open_duplex().prepare(DuplexConfig())


# ---------------------------------------------------------------- chat


def test_chat_streaming(server):
    b = make_backend(server)
    events = list(
        b.chat(
            ChatRequest(
                messages=[Message("system", [TextPart("Be short.")]), user("hi there")],
                generation=GenerationConfig(max_new_tokens=64),
            )
        )
    )
    assert isinstance(events[0], ChatPrefilled)
    done = events[-1]
    assert isinstance(done, ChatDone) and done.text == "echo: hi there"
    assert "".join(e.text for e in events if isinstance(e, ChatDelta)) == "echo: hi there"
    assert done.generated_tokens == 3 and done.input_tokens > 0 and done.audio is None
    init = frames_sent(server, "session.init")[0]["payload"]
    assert init["mode"] == "turn_based" and init["system_prompt"] == "Be short."
    turn = frames_sent(server, "input.append")[0]["input"]
    assert turn["streaming"] is True and turn["generation"] == {
        "max_new_tokens": 64,
        "length_penalty": 1.1,
    }
    assert turn["messages"][1] == {
        "role": "user",
        "content": [{"type": "text", "text": "hi there"}],
    }
    # the per-turn server session was closed, so the next turn gets one
    assert wait_for(lambda: server.mock.active is None)
    assert server.mock.closed_sessions[-1][1] == "client_closed"
    assert isinstance(list(b.chat(ChatRequest(messages=[user("again")])))[-1], ChatDone)


def test_chat_non_streaming_with_tts_returns_full_audio(server):
    b = make_backend(server)
    voice = np.full(8000, 0.01, dtype=np.float32)
    events = list(
        b.chat(
            ChatRequest(
                messages=[user("a b c d")],
                streaming=False,
                tts=TTSConfig(enabled=True, ref_audio=voice),
            )
        )
    )
    assert [type(e) for e in events] == [ChatPrefilled, ChatDone]
    assert events[-1].audio is not None and events[-1].audio.size > 0
    init = frames_sent(server, "session.init")[0]["payload"]
    assert init["voice"]["tts_ref_audio_base64"]
    turn = frames_sent(server, "input.append")[0]["input"]
    assert turn["tts"]["enabled"] is True and turn["tts"]["ref_audio_data"]


def test_chat_streaming_tts_audio_deltas(server):
    b = make_backend(server)
    events = list(
        b.chat(ChatRequest(messages=[user("one two three")], tts=TTSConfig(enabled=True)))
    )
    audio = [e.audio for e in events if isinstance(e, ChatDelta) and e.audio is not None]
    assert audio and all(a.dtype == np.float32 for a in audio)
    assert events[-1].audio.size == sum(a.size for a in audio)


def test_chat_multimodal_parts(server):
    b = make_backend(server)
    msg = Message("user", [TextPart("look"), ImagePart(b"\xff\xd8jpeg"), AudioPart(quiet())])
    list(b.chat(ChatRequest(messages=[msg], max_slice_nums=2)))
    turn = frames_sent(server, "input.append")[0]["input"]
    kinds = [p["type"] for p in turn["messages"][0]["content"]]
    assert kinds == ["text", "image", "audio"] and turn["image"] == {"max_slice_nums": 2}
    audio = np.frombuffer(base64.b64decode(turn["messages"][0]["content"][2]["data"]), dtype="<f4")
    assert audio.size == 16000


def test_chat_video_unsupported(server):
    b = make_backend(server)
    with pytest.raises(UnsupportedInput):
        list(b.chat(ChatRequest(messages=[user("x", VideoPart(frames=[], audio_segments=[]))])))


def test_chat_server_fatal_close_raises(server, monkeypatch):
    b = make_backend(server)
    bad = Message("user", [TextPart("x"), AudioPart(quiet())])
    # corrupt the audio on the wire: the mock answers invalid_input and closes
    with monkeypatch.context() as patch:
        patch.setattr(protocol, "encode_pcm", lambda samples, field_name="audio": "!!notbase64")
        with pytest.raises(LlamaOmniSessionClosed) as info:
            list(b.chat(ChatRequest(messages=[bad])))
    assert info.value.reason == "invalid_input" and info.value.kind == "input"
    assert isinstance(info.value, BackendError)
    assert isinstance(list(b.chat(ChatRequest(messages=[user("ok")])))[-1], ChatDone)


# ---------------------------------------------------------------- duplex


def run(session, n_loud=2, n_after=5):
    return [session.step(DuplexInput(audio=loud())) for _ in range(n_loud)] + [
        session.step(DuplexInput(audio=quiet())) for _ in range(n_after)
    ]


def test_duplex_session(server):
    b = make_backend(server)
    s = b.open_duplex()
    voice = np.full(16000, 0.01, dtype=np.float32)
    prompt = s.prepare(
        DuplexConfig(system_prompt="You are kind.", ref_audio=voice, config={"length_penalty": 1.2})
    )
    assert prompt > 0
    init = frames_sent(server, "session.init")[0]["payload"]
    assert init["mode"] == "full_duplex" and init["use_tts"] is True
    assert init["system_prompt"] == "You are kind." and init["config"] == {"length_penalty": 1.2}
    assert init["voice"]["ref_audio_base64"] and "tts_ref_audio_base64" not in init["voice"]
    steps = run(s)
    assert [st.listen for st in steps[:2]] == [True, True]
    spoken = [st for st in steps if not st.listen]
    assert "".join(st.text for st in spoken) == "".join(SPEECH)
    assert spoken[-1].end_of_turn and not spoken[0].end_of_turn
    assert spoken[0].audio.size == 24000 and spoken[0].audio.dtype == np.float32
    kvs = [st.kv_cache_length for st in steps]
    assert kvs == sorted(kvs) and kvs[0] > prompt
    assert all({"prefill_s", "generate_s", "tts_s"} <= set(st.metrics) for st in steps)
    # pushes are paced: exactly one input.append per step
    assert len(frames_sent(server, "input.append")) == len(steps)
    sid = server.mock.closed_sessions  # nothing closed yet
    assert sid == []
    s.close()
    assert wait_for(lambda: server.mock.closed_sessions == [("sess_1", "client_closed")])


def test_duplex_video_frames(server):
    b = make_backend(server)
    s = b.open_duplex()
    s.prepare(DuplexConfig(mode="video"))
    st = s.step(DuplexInput(audio=quiet(), frames=[b"\xff\xd8a", b"\xff\xd8b"], max_slice_nums=2))
    msg = frames_sent(server, "input.append")[0]["input"]
    assert len(msg["video_frames"]) == 2 and msg["max_slice_nums"] == 2
    assert st.listen
    s.close()


def test_duplex_force_listen_and_interrupt(server):
    b = make_backend(server)
    s = b.open_duplex()
    s.prepare(DuplexConfig())
    s.step(DuplexInput(audio=loud()))
    assert not s.step(DuplexInput(audio=quiet())).listen
    forced = s.step(DuplexInput(audio=quiet(), force_listen=True))
    assert forced.listen and forced.metrics["force_listen"]
    s.interrupt()
    s.step(DuplexInput(audio=quiet()))
    s.step(DuplexInput(audio=quiet()))
    sent = [m["input"]["force_listen"] for m in frames_sent(server, "input.append")]
    assert sent == [False, False, True, True, False]
    s.close()


def test_duplex_late_audio_is_not_lost(server):
    b = make_backend(server)
    s = b.open_duplex()
    s.prepare(DuplexConfig(config={"mock_late_audio": True}))
    steps = run(s, n_after=6)
    total_audio = sum(st.audio.size for st in steps if st.audio is not None)
    assert total_audio == 24000 * 2 + int(24000 * 0.6)
    spoken = [st for st in steps if not st.listen]
    assert "".join(st.text for st in spoken) == "".join(SPEECH)
    s.close()


def test_duplex_stale_response_done_is_not_a_terminator(server):
    """After a listen that ended a turn, the server also sends response.done for the same id."""
    b = make_backend(server)
    s = b.open_duplex()
    s.prepare(DuplexConfig())
    steps = run(s, n_after=8)
    # after the turn the model listens again, and each later step matches its own push
    assert steps[-1].listen and steps[-2].listen
    assert len(frames_sent(server, "input.append")) == len(steps)
    s.close()


def test_duplex_no_reply_times_out_then_recovers(server):
    b = make_backend(server, step_timeout_s=0.5)
    s = b.open_duplex()
    s.prepare(DuplexConfig(config={"mock_silent_chunks": [2]}))
    assert s.step(DuplexInput(audio=quiet())).listen
    with pytest.raises(InferenceError):
        s.step(DuplexInput(audio=quiet()))
    assert s.step(DuplexInput(audio=quiet())).listen  # the session goes on
    s.close()


def test_duplex_fatal_close_is_backend_error(server):
    b = make_backend(server)
    s = b.open_duplex()
    s.prepare(DuplexConfig(config={"mock_fail_at_chunk": 2}))
    s.step(DuplexInput(audio=quiet()))
    with pytest.raises(LlamaOmniSessionClosed) as info:
        s.step(DuplexInput(audio=quiet()))
    assert info.value.reason == "prefill_failed" and isinstance(info.value, BackendError)
    with pytest.raises(BackendError):
        s.step(DuplexInput(audio=quiet()))
    s.close()
    # the backend can open the next session
    s2 = b.open_duplex()
    s2.prepare(DuplexConfig())
    s2.close()


def test_duplex_bad_voice_fatal(server, monkeypatch):
    b = make_backend(server)
    with monkeypatch.context() as patch:
        patch.setattr(protocol, "encode_pcm", lambda samples, field_name="audio": "***")
        with pytest.raises(LlamaOmniSessionClosed) as info:
            b.open_duplex().prepare(DuplexConfig(ref_audio=quiet()))
    assert info.value.reason == "voice_audio_decode_failed" and info.value.kind == "input"
    s = b.open_duplex()  # the failed session released the backend
    s.prepare(DuplexConfig())
    s.close()


def test_server_holds_one_session(server):
    b1 = make_backend(server)
    b2 = make_backend(server)
    s1 = b1.open_duplex()
    s1.prepare(DuplexConfig())
    with pytest.raises(BackendError) as info:
        b2.open_duplex().prepare(DuplexConfig())
    assert "before session.created" in str(info.value)
    with pytest.raises(InferenceError):  # this backend's own guard
        list(b1.chat(ChatRequest(messages=[user("x")])))
    s1.close()
    s3 = b2.open_duplex()
    s3.prepare(DuplexConfig())
    s3.close()


def test_readiness_waits_for_session_created(server):
    b = make_backend(server)
    s = b.open_duplex()
    t0 = time.monotonic()
    s.prepare(DuplexConfig(config={"mock_init_delay_s": 0.6}))
    assert time.monotonic() - t0 >= 0.5
    s.close()


def test_init_timeout(server):
    b = make_backend(server, init_timeout_s=0.3)
    with pytest.raises((BackendError, InferenceError, TimeoutError)):
        b.open_duplex().prepare(DuplexConfig(config={"mock_init_delay_s": 2}))


def test_context_limit(server):
    b = make_backend(server, max_context_tokens=300)
    s = b.open_duplex()
    s.prepare(DuplexConfig(config={"mock_kv_per_chunk": 30}))
    steps = []
    for _ in range(50):
        st = s.step(DuplexInput(audio=quiet()))
        steps.append(st)
        if st.kv_cache_length >= 300:
            break
    assert steps[-1].metrics.get("context_full") and steps[-1].kv_cache_length >= 300
    sent = len(frames_sent(server, "input.append"))
    assert sent == len([st for st in steps if not st.metrics.get("skipped")])
    assert all(st.kv_cache_length < 300 for st in steps if not st.metrics.get("skipped"))
    s.close()


def test_close_after_server_side_close_is_quiet(server):
    b = make_backend(server)
    s = b.open_duplex()
    s.prepare(DuplexConfig())
    sid = server.mock.active.session_id
    req = urllib.request.Request(f"{server.url}/sessions/{sid}/close", data=b"{}", method="POST")
    with urllib.request.urlopen(req) as resp:
        assert json.loads(resp.read()) == {"ok": True, "session_id": sid, "closed": True}
    with pytest.raises(LlamaOmniSessionClosed) as info:
        s.step(DuplexInput(audio=quiet()))
    assert info.value.reason in ("client_closed", "connection_lost")
    s.close()
    s.close()


def test_mock_server_as_subprocess():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", MOCK_SERVER, "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=0.5) as r:
                    return r.status == 200
            except OSError:
                return False

        assert wait_for(up, 15)
        b = create_backend("llama_omni", backend_url=url)
        s = b.open_duplex()
        s.prepare(DuplexConfig())
        assert s.step(DuplexInput(audio=quiet())).listen
        s.close()
    finally:
        proc.terminate()
        proc.wait(10)
