"""The minicpmo backend's loading and chat turns against the strict stand-in.

(Duplex sessions: tests/unit/inference/minicpmo/test_duplex.py.)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

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
from tests.support.minicpmo_helpers import jpeg, loud, make_backend, quiet, to_speech, user, voice
from tests.support.standins import fake_minicpmo
from tests.support.standins.fake_minicpmo import StandInFault

ROOT = Path(__file__).resolve().parents[4]


# ---------------------------------------------------------------- loading


def test_import_is_light():
    code = (
        "import inference.registry, inference.minicpmo, sys; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False False", out.stderr


def test_loader_gets_the_configured_options():
    b = make_backend(init_vision=False, attn_implementation="eager")
    model = b.model
    assert isinstance(model, fake_minicpmo.FakeMiniCPMO)
    assert model.options["init_vision"] is False
    assert model.options["attn_implementation"] == "eager"
    assert model.options["dtype"] == "bfloat16"
    info = b.info()
    assert info["backend"] == "minicpmo" and "load_seconds" in info and info["init_vision"] is False
    assert info["unit_samples"] == 16000 and info["duplex"] is True


def test_one_wrapper_and_one_init_tts_with_the_backends_settings():
    """The wrapper is built once, at load; init_tts runs once, with our settings."""
    b = make_backend(tts_float16=True, tts_n_timesteps=5)
    model = b.model
    assert model.call_names().count("as_duplex") == 1
    inits = [kw for name, kw in model.calls if name == "init_tts"]
    assert inits == [{"enable_float16": True, "n_timesteps": 5}]
    assert model.tts.audio_tokenizer.n_timesteps == 5
    wrapper = b.duplex_wrapper
    built = wrapper.init_kwargs  # built as the demo builds it (init_unified's duplex_config)
    assert (built["force_listen_count"], built["top_k"], built["generate_audio"]) == (3, 20, True)
    for _ in range(3):
        s = b.open_duplex()
        s.prepare(DuplexConfig(ref_audio=voice()))
        s.step(DuplexInput(audio=quiet()))
        s.close()
    assert model.call_names().count("as_duplex") == 1
    assert model.call_names().count("init_tts") == 1
    assert model.duplex_wrappers == [wrapper]


def test_stand_in_refuses_a_second_init_tts_and_a_second_wrapper():
    b = make_backend()
    with pytest.raises(StandInFault):
        b.model.init_tts()
    with pytest.raises(StandInFault):  # as_duplex runs init_tts again
        b.model.as_duplex(device="cpu")


def test_text_only_worker_builds_its_wrapper_without_a_tts_module():
    """With TTS off the model has no TTS module; the wrapper is still built."""
    b = make_backend(init_tts=False)
    assert not hasattr(b.model, "tts")
    with pytest.raises(AttributeError):  # what the wrapper's own init_tts() call would hit
        b.model.init_tts()
    assert b.duplex_wrapper is not None and b.duplex_wrapper.generate_audio is False
    s = b.open_duplex()
    s.prepare(DuplexConfig(system_prompt="hi"))
    s.close()


def test_text_only_duplex_on_a_speaking_worker_keeps_the_vocoder_for_chat():
    b = make_backend(duplex_generate_audio=False)
    assert b.duplex_wrapper.generate_audio is False
    assert b.model.call_names().count("init_tts") == 1  # inside as_duplex, not again
    events = list(b.chat(ChatRequest(messages=[user("x")], tts=TTSConfig(True, ref_audio=voice()))))
    assert events[-1].audio is not None


def test_remote_code_without_as_duplex_serves_chat_and_refuses_duplex():
    original = fake_minicpmo.FakeMiniCPMO.as_duplex
    try:
        del fake_minicpmo.FakeMiniCPMO.as_duplex
        b = make_backend()
        assert b.model.call_names().count("init_tts") == 1  # loaded directly
        session = b.open_duplex()
        with pytest.raises(BackendError, match="as_duplex"):
            session.prepare(DuplexConfig(system_prompt="hi", ref_audio=voice()))
        assert b.info()["duplex_active"] is False
        assert list(b.chat(ChatRequest(messages=[user("still here")])))[-1].text.endswith("here")
    finally:
        fake_minicpmo.FakeMiniCPMO.as_duplex = original


def test_model_path_required_without_loader():
    with pytest.raises(ValueError):
        create_backend("minicpmo")


def test_default_loader_rejects_missing_dir(tmp_path):
    with pytest.raises(BackendError):
        create_backend("minicpmo", model_path=str(tmp_path / "nope"), device="cpu")


# ---------------------------------------------------------------- chat


def test_chat_streaming_text():
    b = make_backend()
    request = ChatRequest(messages=[user("hi there")], generation=GenerationConfig(64))
    events = list(b.chat(request))
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
    assert ("init_token2wav_cache", {"samples": 32000}) in b.model.calls
    prefill_roles = [kw["role"] for n, kw in b.model.calls if n == "streaming_prefill"]
    assert prefill_roles[0] == "system"  # voice-clone system prompt with the reference audio


def test_spoken_chat_turns_leave_no_temporary_wav(tmp_path, monkeypatch):
    """init_token2wav_cache writes the voice to a temp WAV it never removes: ours are removed."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    b = make_backend()
    for _ in range(3):
        list(b.chat(ChatRequest(messages=[user("x")], tts=TTSConfig(True, ref_audio=voice()))))
    assert len(b.model.token2wav_files) == 3  # the stand-in did write them, as the model does
    assert list(tmp_path.iterdir()) == []
    assert tempfile.tempdir == str(tmp_path)


def test_chat_after_a_duplex_session_runs_with_the_models_own_stream_constants():
    """from_existing_model sets CNN_REDUNDANCY_MS=20 for duplex; chat keeps 0."""
    b = make_backend()
    list(b.chat(ChatRequest(messages=[user("before")])))
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice()))
    assert b.model.stream_configs[-1]["cnn_redundancy_ms"] == 20  # the duplex front end
    s.step(DuplexInput(audio=quiet()))
    s.close()
    list(b.chat(ChatRequest(messages=[user("after")])))
    prefills = [kw for n, kw in b.model.calls if n == "streaming_prefill"]
    assert [p["cnn_redundancy_ms"] for p in prefills] == [0, 0]
    assert b.model.CNN_REDUNDANCY_MS == 0


def test_chat_tts_without_voice_is_invalid():
    b = make_backend()
    with pytest.raises(UnsupportedInput):
        list(b.chat(ChatRequest(messages=[user("x")], tts=TTSConfig(enabled=True))))


def test_chat_tts_on_a_text_only_worker_is_invalid():
    b = make_backend(init_tts=False)
    with pytest.raises(UnsupportedInput):
        list(b.chat(ChatRequest(messages=[user("x")], tts=TTSConfig(True, ref_audio=voice()))))


def test_chat_default_voice_from_ref_audio_path(tmp_path):
    path = tmp_path / "voice.wav"
    write_wav(path, voice(), 16000)
    b = make_backend(ref_audio_path=str(path))
    events = list(
        b.chat(ChatRequest(messages=[user("x")], tts=TTSConfig(enabled=True), streaming=False))
    )
    assert not any(isinstance(e, ChatDelta) for e in events)  # non-streaming: only done
    assert events[-1].audio is not None
    assert "init_token2wav_cache" in b.model.call_names()


def test_chat_non_streaming_text_uses_chat():
    b = make_backend()
    events = list(b.chat(ChatRequest(messages=[user("hello")], streaming=False)))
    assert [type(e) for e in events] == [ChatPrefilled, ChatDone]
    assert events[-1].text == "echo: hello" and events[-1].generated_tokens == 2
    assert events[0].input_tokens > 0 and events[-1].input_tokens == events[0].input_tokens
    chat_kw = next(kw for n, kw in b.model.calls if n == "chat")
    assert chat_kw["generate_audio"] is False and chat_kw["temperature"] == 0.7
    assert chat_kw["n_msgs"] == 1


def test_chat_multimodal_segments():
    b = make_backend()
    msg = Message(
        role="user",
        content=[ImagePart(jpeg()), TextPart("what is this"), AudioPart(loud()), AudioPart(loud())],
    )
    events = list(b.chat(ChatRequest(messages=[msg])))
    assert isinstance(events[-1], ChatDone)
    prefills = [kw for n, kw in b.model.calls if n == "streaming_prefill"]
    assert len(prefills) == 2  # one audio per streaming_prefill call
    assert prefills[-1]["is_last_chunk"] is True


def test_chat_long_audio_is_prefilled_in_model_chunks():
    # the streaming path encodes one chunk per call (1035 ms first, then 1000 ms)
    b = make_backend()
    msg = Message(role="user", content=[AudioPart(loud(2.5)), TextPart("what?")])
    events = list(b.chat(ChatRequest(messages=[msg])))
    assert isinstance(events[-1], ChatDone)
    prefills = [kw for n, kw in b.model.calls if n == "streaming_prefill"]
    assert len(prefills) == 4  # 1.035 s + 1 s + 0.465 s of audio, then the text
    assert [p["is_last_chunk"] for p in prefills] == [False, False, True, False]


def test_chat_short_audio_tail_mid_stream_is_padded():
    b = make_backend()
    msgs = [
        Message(role="user", content=[AudioPart(loud(1.5)), AudioPart(loud(0.4))]),
        Message(role="assistant", content=[TextPart("ok")]),
        user("and this", AudioPart(loud(0.7))),
    ]
    assert isinstance(list(b.chat(ChatRequest(messages=msgs)))[-1], ChatDone)
    prefills = [kw for n, kw in b.model.calls if n == "streaming_prefill"]
    assert sum(p["is_last_chunk"] for p in prefills) == 1


def test_chat_text_only_generated_tokens_counts_text():
    b = make_backend()
    events = list(b.chat(ChatRequest(messages=[user("one two three four")])))
    assert events[-1].text == "echo: one two three four"
    assert events[-1].generated_tokens == 5  # the stand-in's tokenizer counts words


def test_chat_video_is_laid_out_per_second():
    b = make_backend()
    video = VideoPart(frames=[jpeg(), jpeg()], audio_segments=[loud(), loud()])
    events = list(b.chat(ChatRequest(messages=[user("describe", video)])))
    assert isinstance(events[-1], ChatDone)
    prefills = [kw for n, kw in b.model.calls if n == "streaming_prefill"]
    assert len(prefills) == 2 and all(p["omni_mode"] for p in prefills)
    assert [p["n_items"] for p in prefills] == [3, 2]  # text, frame, audio | frame, audio


def test_chat_video_stack_frames_adds_one_stacked_image_per_second():
    """spec/05 stack_frames: frame, audio, then the second's other frames."""
    from inference.minicpmo.messages import video_contents

    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (9, 9, 9), (200, 200, 0), (0, 90, 90)]
    video = VideoPart(
        frames=[jpeg(c) for c in colors], audio_segments=[loud(), quiet()], stack_frames=3
    )
    items = video_contents(video, 0)
    kinds = ["audio" if isinstance(i, np.ndarray) else "image" for i in items]
    assert kinds == ["image", "audio", "image", "image", "audio", "image"]
    first, stacked = items[0], items[2]
    assert first.size == (32, 24)
    assert stacked.size in ((2 * 32 + 6, 24), (32, 2 * 24 + 6))  # two frames in one image
    assert stacked.getpixel((2, 2))[1] > 200  # the second frame of the second (green) comes first
    plain = video_contents(VideoPart(frames=[jpeg()] * 2, audio_segments=[loud()] * 2), 0)
    assert len(plain) == 4  # stack_frames=1: frame, audio per second
    b = make_backend()
    assert isinstance(list(b.chat(ChatRequest(messages=[user("x", video)])))[-1], ChatDone)


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
    monkeypatch.undo()
    assert isinstance(list(b.chat(ChatRequest(messages=[user("y")])))[-1], ChatDone)


def test_chat_waits_for_duplex_and_backend_close():
    b = make_backend()
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice()))
    with pytest.raises(InferenceError):
        list(b.chat(ChatRequest(messages=[user("x")])))
    s.close()
    assert isinstance(list(b.chat(ChatRequest(messages=[user("x")])))[-1], ChatDone)
    b.close()
    with pytest.raises(BackendError):
        list(b.chat(ChatRequest(messages=[user("x")])))


def test_backend_close_lets_the_weights_go():
    """After ``close`` nothing of the backend's (its ``loaded`` record, a closed duplex session)
    keeps the model alive: on a GPU, ``empty_cache`` can then free the weights, not only the
    cache (an H100 run showed 544 MiB still allocated after close when ``loaded`` held them)."""
    import gc
    import weakref

    b = make_backend()
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice()))
    to_speech(s)
    s.close()
    fake_minicpmo.INSTANCES.remove(b.model)  # (the stand-in's own registry, for other tests)
    model = weakref.ref(b.model)
    b.close()
    gc.collect()
    assert model() is None
    assert s._model is None


def test_gpu_memory_reads_the_configured_device(monkeypatch):
    """``cuda:1`` reports device 1's memory, not the current device's (torch.cuda's API: a
    device argument, the current device when None)."""
    from inference.minicpmo import loading

    asked: list[object] = []

    class Cuda:
        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def memory_allocated(device: object = None) -> int:
            asked.append(device)
            return 1 if device == "cuda:1" else 0

        @staticmethod
        def memory_reserved(device: object = None) -> int:
            asked.append(device)
            return 2 if device == "cuda:1" else 0

    class Torch:
        cuda = Cuda

    monkeypatch.setattr(loading, "torch_module", lambda: Torch)
    assert loading.gpu_memory("cuda:1") == {
        "gpu_memory_allocated_bytes": 1,
        "gpu_memory_reserved_bytes": 2,
    }
    assert asked == ["cuda:1", "cuda:1"]
    assert loading.gpu_memory("cpu") == {}


def test_minicpmo_extra_pins_what_the_models_code_supports():
    """torch/torchaudio pinned to the model README's range (<= 2.8.0)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = {
        r.name: r for r in map(Requirement, project["project"]["optional-dependencies"]["minicpmo"])
    }
    for name in ("torch", "torchaudio"):
        assert extra[name].specifier.contains("2.8.0") and extra[name].specifier.contains("2.3.0")
        assert not extra[name].specifier.contains("2.9.0") and not extra[name].specifier.contains(
            "2.2.0"
        )
    assert str(extra["transformers"].specifier) == "==4.51.0"
    package_data = project["tool"]["setuptools"]["package-data"]["omniserve"]
    assert "data/*.wav" in package_data  # the doctor's speech sample ships with the package
