"""The minicpmo backend against the fake model (tests/standins/fake_minicpmo.py)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference import (
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
from omnicore.audio import write_wav
from tests.standins import fake_minicpmo

LOADER = "tests.standins.fake_minicpmo:load"


def make_backend(**opts):
    opts.setdefault("model_path", "/models/fake")
    opts.setdefault("device", "cpu")
    return create_backend("minicpmo", model_loader=LOADER, **opts)


def jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 10, 10)).save(buf, format="JPEG")
    return buf.getvalue()


def loud(seconds=1.0):
    t = np.arange(int(16000 * seconds), dtype=np.float32) / 16000
    return (0.5 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def quiet(seconds=1.0):
    return np.zeros(int(16000 * seconds), dtype=np.float32)


def voice():
    return (0.1 * np.sin(np.arange(16000 * 2) / 10)).astype(np.float32)


def user(text, *parts):
    return Message(role="user", content=[TextPart(text), *parts])


# ---------------------------------------------------------------- loading


def test_import_is_light():
    import subprocess

    code = (
        "import inference.registry, inference.minicpmo, sys; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert out.stdout.strip() == "False False", out.stderr


def test_loads_through_configuration_and_inits_tts():
    b = make_backend(init_vision=False, attn_implementation="eager")
    model = b.model
    assert isinstance(model, fake_minicpmo.FakeMiniCPMO)
    assert model.options["init_vision"] is False
    assert model.options["attn_implementation"] == "eager"
    assert model.options["dtype"] == "bfloat16"
    assert (
        "init_tts",
        {"streaming": True, "enable_float16": False, "n_timesteps": 10},
    ) in model.calls or any(
        name == "init_tts" and kw["streaming"] is True for name, kw in model.calls
    )
    info = b.info()
    assert info["backend"] == "minicpmo" and "load_seconds" in info and info["init_vision"] is False


def test_no_tts_when_disabled():
    b = make_backend(init_tts=False)
    assert "init_tts" not in b.model.call_names()


def test_model_path_required_without_loader():
    with pytest.raises(ValueError):
        create_backend("minicpmo")


def test_default_loader_rejects_missing_dir(tmp_path):
    with pytest.raises(BackendError):
        create_backend("minicpmo", model_path=str(tmp_path / "nope"), device="cpu")


# ---------------------------------------------------------------- chat


def test_chat_streaming_text():
    b = make_backend()
    events = list(
        b.chat(
            ChatRequest(messages=[user("hi there")], generation=GenerationConfig(max_new_tokens=64))
        )
    )
    assert isinstance(events[0], ChatPrefilled) and events[0].input_tokens > 0
    assert isinstance(events[-1], ChatDone)
    deltas = [e for e in events if isinstance(e, ChatDelta)]
    assert "".join(d.text for d in deltas) == "echo: hi there" == events[-1].text
    assert all(d.audio is None for d in deltas)
    assert events[-1].generated_tokens == 3
    names = b.model.call_names()
    assert names.index("streaming_prefill") < names.index("streaming_generate")
    gen_kw = next(kw for n, kw in b.model.calls if n == "streaming_generate")
    assert gen_kw["generate_audio"] is False and gen_kw["max_new_tokens"] == 64
    assert gen_kw["length_penalty"] == 1.1 and gen_kw["temperature"] == 0.7
    assert names[-1] == "reset_session"  # state cleared after the turn


def test_chat_streaming_with_tts_uses_voice_for_vocoder_and_system_prompt():
    b = make_backend()
    req = ChatRequest(
        messages=[user("say hi")],
        tts=TTSConfig(enabled=True, mode="audio_assistant", ref_audio=voice()),
    )
    events = list(b.chat(req))
    deltas = [e for e in events if isinstance(e, ChatDelta)]
    assert deltas and all(d.audio is not None and d.audio.dtype == np.float32 for d in deltas)
    done = events[-1]
    assert done.audio is not None and done.audio.size == 24000 * len(deltas)
    calls = b.model.calls
    assert ("init_token2wav_cache", {"samples": 32000}) in calls
    prefill_roles = [kw["role"] for n, kw in calls if n == "streaming_prefill"]
    assert prefill_roles[0] == "system"  # voice-clone system prompt with the reference audio


def test_chat_tts_without_voice_is_invalid():
    b = make_backend()
    with pytest.raises(UnsupportedInput):
        list(b.chat(ChatRequest(messages=[user("x")], tts=TTSConfig(enabled=True))))


def test_chat_default_voice_from_ref_audio_path(tmp_path):
    path = tmp_path / "voice.wav"
    write_wav(path, voice(), 16000)
    b = make_backend(ref_audio_path=str(path))
    events = list(
        b.chat(ChatRequest(messages=[user("x")], tts=TTSConfig(enabled=True), streaming=False))
    )
    assert not any(isinstance(e, ChatDelta) for e in events)  # non-streaming: only done
    assert events[-1].audio is not None
    assert any(n == "init_token2wav_cache" for n in b.model.call_names())


def test_chat_non_streaming_text_uses_chat():
    b = make_backend()
    events = list(b.chat(ChatRequest(messages=[user("hello")], streaming=False)))
    assert [type(e) for e in events] == [ChatPrefilled, ChatDone]
    assert events[-1].text == "echo: hello" and events[-1].generated_tokens == 2
    chat_kw = next(kw for n, kw in b.model.calls if n == "chat")
    assert chat_kw["generate_audio"] is False and chat_kw["temperature"] == 0.7


def test_chat_multimodal_segments():
    b = make_backend()
    msg = Message(
        role="user",
        content=[
            ImagePart(jpeg()),
            TextPart("what is this"),
            AudioPart(loud()),
            AudioPart(loud()),
        ],
    )
    events = list(b.chat(ChatRequest(messages=[msg])))
    assert isinstance(events[-1], ChatDone)
    prefills = [kw for n, kw in b.model.calls if n == "streaming_prefill"]
    assert len(prefills) == 2  # one audio per streaming_prefill call
    assert prefills[-1]["is_last_chunk"] is True


def test_chat_long_audio_is_prefilled_in_model_chunks():
    # the real streaming path encodes one chunk per call (1035 ms first, then 1000 ms); a 2.5 s
    # clip in one call fails inside the model (checked against the real remote code, tiny weights)
    b = make_backend()
    events = list(
        b.chat(
            ChatRequest(
                messages=[Message(role="user", content=[AudioPart(loud(2.5)), TextPart("what?")])]
            )
        )
    )
    assert isinstance(events[-1], ChatDone)
    prefills = [kw for n, kw in b.model.calls if n == "streaming_prefill"]
    assert len(prefills) == 4  # 1.035 s + 1 s + 0.465 s of audio, then the text
    # the flush flag goes with the last audio chunk, not with the text after it
    assert [p["is_last_chunk"] for p in prefills] == [False, False, True, False]


def test_chat_short_audio_tail_mid_stream_is_padded():
    b = make_backend()
    msgs = [
        Message(role="user", content=[AudioPart(loud(1.5)), AudioPart(loud(0.4))]),
        Message(role="assistant", content=[TextPart("ok")]),
        user("and this", AudioPart(loud(0.7))),
    ]
    events = list(b.chat(ChatRequest(messages=msgs)))
    assert isinstance(events[-1], ChatDone)
    prefills = [kw for n, kw in b.model.calls if n == "streaming_prefill"]
    assert sum(p["is_last_chunk"] for p in prefills) == 1


def test_chat_text_only_generated_tokens_counts_text():
    b = make_backend()
    events = list(b.chat(ChatRequest(messages=[user("one two three four")])))
    assert events[-1].text == "echo: one two three four"
    assert events[-1].generated_tokens == 5  # the fake tokenizer counts words


def test_chat_non_streaming_input_tokens_from_returned_prompt():
    b = make_backend()
    events = list(b.chat(ChatRequest(messages=[user("hello")], streaming=False)))
    assert events[0].input_tokens > 0 and events[-1].input_tokens == events[0].input_tokens
    chat_kw = next(kw for n, kw in b.model.calls if n == "chat")
    assert chat_kw["n_msgs"] == 1


def test_chat_video_interleaves_frames_and_audio():
    b = make_backend()
    video = VideoPart(frames=[jpeg(), jpeg()], audio_segments=[loud(), loud()])
    events = list(b.chat(ChatRequest(messages=[user("describe", video)])))
    assert isinstance(events[-1], ChatDone)
    prefills = [kw for n, kw in b.model.calls if n == "streaming_prefill"]
    assert len(prefills) == 2 and all(p["omni_mode"] for p in prefills)


def test_chat_bad_image_is_invalid_payload():
    b = make_backend()
    with pytest.raises(UnsupportedInput):
        list(b.chat(ChatRequest(messages=[user("x", ImagePart(b"not an image"))])))


def test_chat_model_failure_is_inference_error(monkeypatch):
    b = make_backend()

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(b.model, "streaming_generate", boom)
    with pytest.raises(InferenceError):
        list(b.chat(ChatRequest(messages=[user("x")])))
    # the backend is still usable afterwards
    monkeypatch.undo()
    assert isinstance(list(b.chat(ChatRequest(messages=[user("y")])))[-1], ChatDone)


# ---------------------------------------------------------------- duplex


def run_conversation(session, n_loud=2, n_after=5, **chunk_kw):
    steps = [session.step(DuplexInput(audio=loud(), **chunk_kw)) for _ in range(n_loud)]
    steps.extend(session.step(DuplexInput(audio=quiet(), **chunk_kw)) for _ in range(n_after))
    return steps


def test_duplex_call_sequence_and_outputs():
    b = make_backend()
    s = b.open_duplex()
    prompt_len = s.prepare(DuplexConfig(system_prompt="Be brief.", ref_audio=voice()))
    assert prompt_len > 0
    steps = run_conversation(s)
    assert [st.listen for st in steps[:2]] == [True, True]
    spoken = [st for st in steps if not st.listen]
    assert "".join(st.text for st in spoken) == "".join(fake_minicpmo.SPEECH)
    assert spoken[-1].end_of_turn and not spoken[0].end_of_turn
    assert all(st.audio is not None and st.audio.dtype == np.float32 for st in spoken)
    assert spoken[0].audio.size == 24000
    assert all(st.audio is None and st.text == "" for st in steps if st.listen)
    kvs = [st.kv_cache_length for st in steps]
    assert kvs == sorted(kvs) and kvs[0] > prompt_len
    for st in steps:
        assert {"prefill_s", "generate_s", "tts_s"} <= set(st.metrics)
    names = b.model.call_names()
    i_dup = names.index("as_duplex")
    assert names[i_dup + 1] == "duplex.prepare"
    body = [n for n in names[i_dup + 2 :]]
    assert body[: 2 * len(steps)] == [
        "duplex.streaming_prefill",
        "duplex.streaming_generate",
    ] * len(steps)
    prep = next(kw for n, kw in b.model.calls if n == "duplex.prepare")
    assert prep["prefix_system_prompt"].startswith("<|im_start|>system\nBe brief.")
    assert prep["suffix_system_prompt"] == "<|audio_end|><|im_end|>"
    assert prep["ref_audio"] == 32000 and prep["prompt_wav_path"].endswith(".wav")
    s.close()


def test_duplex_video_frames_are_decoded_and_passed():
    b = make_backend()
    s = b.open_duplex()
    s.prepare(DuplexConfig(mode="video", ref_audio=voice()))
    s.step(DuplexInput(audio=quiet(), frames=[jpeg()], max_slice_nums=2))
    kw = next(kw for n, kw in b.model.calls if n == "duplex.streaming_prefill")
    assert kw == {"audio": 16000, "frames": 1, "max_slice_nums": 2}
    s.close()


def test_duplex_force_listen_per_chunk_and_interrupt():
    b = make_backend()
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice()))
    s.step(DuplexInput(audio=loud()))
    st = s.step(DuplexInput(audio=quiet()))  # would start speaking ...
    assert not st.listen
    forced = s.step(DuplexInput(audio=quiet(), force_listen=True))
    assert forced.listen and forced.metrics["force_listen"] is True
    gen = [kw for n, kw in b.model.calls if n == "duplex.streaming_generate"]
    assert [g["force_listen_override"] for g in gen] == [False, False, True]
    s.interrupt()
    s.step(DuplexInput(audio=quiet()))
    gen = [kw for n, kw in b.model.calls if n == "duplex.streaming_generate"]
    assert gen[-1]["force_listen_override"] is True
    s.step(DuplexInput(audio=quiet()))
    gen = [kw for n, kw in b.model.calls if n == "duplex.streaming_generate"]
    assert gen[-1]["force_listen_override"] is False  # interrupt is one-shot
    s.close()


def test_duplex_force_listen_on_revision_without_override(monkeypatch):
    """Older remote code has no per-call override: force_listen_count is set for one call."""
    b = make_backend()
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice()))
    wrapper = b.model.duplex_wrappers[-1]
    original = wrapper.streaming_generate

    def no_override(
        prompt_wav_path=None,
        max_new_speak_tokens_per_chunk=20,
        decode_mode="sampling",
        temperature=0.7,
        top_k=20,
        top_p=0.8,
        listen_prob_scale=1.0,
        listen_top_k=None,
        text_repetition_penalty=1.05,
        text_repetition_window_size=512,
    ):
        return original(
            prompt_wav_path=prompt_wav_path,
            max_new_speak_tokens_per_chunk=max_new_speak_tokens_per_chunk,
        )

    monkeypatch.setattr(wrapper, "streaming_generate", no_override)
    s.step(DuplexInput(audio=loud()))
    assert s.step(DuplexInput(audio=quiet(), force_listen=True)).listen
    assert wrapper.force_listen_count == 0  # restored
    assert not s.step(DuplexInput(audio=quiet())).listen  # speaks again (turn was pending)
    s.close()


def test_duplex_stops_at_context_limit():
    b = make_backend(max_context_tokens=400)
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice()))
    steps = []
    for _ in range(100):
        st = s.step(DuplexInput(audio=quiet()))
        steps.append(st)
        if st.kv_cache_length >= b.max_context_tokens:
            break
    assert steps[-1].kv_cache_length >= 400 and steps[-1].metrics.get("context_full")
    real = [st for st in steps if not st.metrics.get("skipped")]
    assert all(st.kv_cache_length < 400 for st in real)  # no model step ever crossed the limit
    n_generate = b.model.call_names().count("duplex.streaming_generate")
    assert n_generate == len(real)
    assert s.step(DuplexInput(audio=quiet())).metrics.get("skipped")  # stays stopped
    assert b.model.call_names().count("duplex.streaming_generate") == n_generate
    s.close()


def test_duplex_8192_default_limit():
    b = make_backend()
    assert b.max_context_tokens == 8192
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice()))
    wrapper = b.model.duplex_wrappers[-1]
    wrapper.decoder.cache_length = 8192 - 50  # a long conversation
    st = s.step(DuplexInput(audio=quiet()))
    assert st.listen and st.kv_cache_length == 8192 and st.metrics["context_full"]
    assert "duplex.streaming_prefill" not in b.model.call_names()
    s.close()


def test_duplex_session_settings_do_not_leak():
    b = make_backend()
    s1 = b.open_duplex()
    s1.prepare(
        DuplexConfig(
            ref_audio=voice(),
            tts_ref_audio=voice()[:16000],
            config={
                "temperature": 0.3,
                "length_penalty": 1.5,
                "top_k": 5,
                "force_listen_count": 2,
                "max_new_speak_tokens_per_chunk": 8,
            },
        )
    )
    s1.step(DuplexInput(audio=quiet()))
    first = [kw for n, kw in b.model.calls if n == "duplex.streaming_generate"][-1]
    assert (first["temperature"], first["length_penalty"], first["top_k"]) == (0.3, 1.5, 5)
    assert first["max_new_speak_tokens_per_chunk"] == 8
    w1 = b.model.duplex_wrappers[-1]
    wav1 = first["prompt_wav_path"]
    assert Path(wav1).exists()
    s1.close()
    assert not Path(wav1).exists()  # the session's voice file is gone
    # nothing of the session is left on the model
    assert b.model.token2wav_cache is None
    tok = b.model.tts.audio_tokenizer
    assert tok.stream_cache is None and tok.cache is None and tok.hift_cache_dict is None
    assert w1.decoder.get_cache_length() == 0
    assert b.model.call_names()[-1] == "reset_session"
    assert "duplex.as_simplex" in b.model.call_names()

    s2 = b.open_duplex()
    s2.prepare(DuplexConfig(ref_audio=voice()[:8000]))  # its own voice, not session 1's TTS voice
    prep2 = b.model.calls[-1][1]
    assert prep2["ref_audio"] == 8000 and prep2["prompt_wav_path"] != wav1
    second_init = [kw for n, kw in b.model.calls if n == "as_duplex"][-1]
    assert second_init["force_listen_count"] == 0
    assert s2.step(DuplexInput(audio=quiet())).listen
    gen = [kw for n, kw in b.model.calls if n == "duplex.streaming_generate"][-1]
    assert (gen["temperature"], gen["length_penalty"], gen["top_k"]) == (0.7, 1.1, 20)
    assert gen["max_new_speak_tokens_per_chunk"] == 20
    w2 = b.model.duplex_wrappers[-1]
    assert (w2.temperature, w2.top_k, w2.max_new_speak_tokens_per_chunk) == (0.7, 20, 20)
    s2.close()


def test_duplex_without_any_voice_and_tts_is_invalid():
    b = make_backend()
    s = b.open_duplex()
    with pytest.raises(UnsupportedInput):
        s.prepare(DuplexConfig())  # TTS on, no voice, no default voice
    # the backend is clean and usable
    s2 = b.open_duplex()
    s2.prepare(DuplexConfig(ref_audio=voice()))
    s2.close()


def test_duplex_text_only_worker_needs_no_voice():
    b = make_backend(init_tts=False)
    s = b.open_duplex()
    s.prepare(DuplexConfig(system_prompt="hi"))
    prep = next(kw for n, kw in b.model.calls if n == "duplex.prepare")
    assert prep["prompt_wav_path"] is None and prep["suffix_system_prompt"] == "<|im_end|>"
    steps = run_conversation(s)
    spoken = [st for st in steps if not st.listen]
    assert spoken and all(st.audio is None for st in spoken)
    s.close()


def test_duplex_bad_config_value():
    b = make_backend()
    s = b.open_duplex()
    with pytest.raises(UnsupportedInput):
        s.prepare(DuplexConfig(ref_audio=voice(), config={"temperature": "hot"}))


def test_duplex_unknown_config_key_ignored():
    b = make_backend()
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice(), config={"some_other_backend_knob": 3}))
    s.close()


def test_closed_session_refuses_steps_and_close_is_idempotent():
    b = make_backend()
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice()))
    s.close()
    s.close()
    with pytest.raises(BackendError):
        s.step(DuplexInput(audio=quiet()))


def test_open_duplex_closes_a_stale_session_and_chat_waits_for_duplex():
    b = make_backend()
    s1 = b.open_duplex()
    s1.prepare(DuplexConfig(ref_audio=voice()))
    with pytest.raises(InferenceError):
        list(b.chat(ChatRequest(messages=[user("x")])))
    s2 = b.open_duplex()  # s1 was never closed
    s2.prepare(DuplexConfig(ref_audio=voice()))
    with pytest.raises(BackendError):
        s1.step(DuplexInput(audio=quiet()))
    s2.close()
    assert isinstance(list(b.chat(ChatRequest(messages=[user("x")])))[-1], ChatDone)


def test_backend_close():
    b = make_backend()
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice()))
    b.close()
    with pytest.raises(BackendError):
        list(b.chat(ChatRequest(messages=[user("x")])))


def test_duplex_without_as_duplex_fails_cleanly():
    # the MiniCPM-o-Demo copy of modeling_minicpmo.py has no as_duplex()
    b = make_backend()
    original = type(b.model).as_duplex
    try:
        del type(b.model).as_duplex
        session = b.open_duplex()
        with pytest.raises(BackendError, match="as_duplex"):
            session.prepare(DuplexConfig(system_prompt="hi", ref_audio=voice()))
        assert b.info()["duplex_active"] is False
    finally:
        type(b.model).as_duplex = original
    events = list(b.chat(ChatRequest(messages=[user("still here")])))
    assert events[-1].text == "echo: still here"
