"""The minicpmo backend's duplex sessions against the strict stand-in, on each revision of the
model's duplex wrapper (published: deferred ``finalize_unit``; legacy: no finalize_unit / no
per-call forced listen; demo: ``prepare`` takes chat markup).

Each way of misdriving the model's duplex API has a test that fails if it is done; the stand-in
raises ``StandInFault`` where the real model would silently corrupt its state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inference import (
    BackendError,
    DuplexConfig,
    DuplexInput,
    InferenceError,
    UnsupportedInput,
)
from tests.support.minicpmo_helpers import (
    UNIT,
    jpeg,
    loud,
    make_backend,
    quiet,
    to_speech,
    units,
    voice,
)
from tests.support.standins.fake_minicpmo import SPEECH, StandInFault

REVISIONS = ["published", "legacy", "demo"]


@pytest.fixture(params=REVISIONS)
def revision(request: pytest.FixtureRequest) -> str:
    return request.param


def prepared(revision: str = "published", config: DuplexConfig | None = None, **opts):
    b = make_backend(revision, **opts)
    s = b.open_duplex()
    s.prepare(config or DuplexConfig(system_prompt="Be brief.", ref_audio=voice()))
    return b, s


# ---------------------------------------------------------------- a conversation


def test_conversation_and_call_sequence(revision):
    b, s = prepared(revision)
    steps = to_speech(s) + [s.step(u) for u in units(quiet(), quiet(), quiet())]
    spoken = [st for st in steps if not st.listen]
    assert "".join(st.text for st in spoken) == "".join(SPEECH)
    assert [st.end_of_turn for st in spoken] == [False, False, True]
    assert all(st.audio is not None and st.audio.dtype == np.float32 for st in spoken)
    assert spoken[0].audio.size == 24000
    assert all(st.audio is None and st.text == "" for st in steps if st.listen)
    assert steps[-1].listen  # listening again after the turn
    kvs = [st.kv_cache_length for st in steps]
    assert kvs == sorted(kvs) and kvs[0] > s.prompt_length > 0
    for st in steps:
        assert {"prefill_s", "generate_s", "tts_s", "vision_slices", "vision_tokens"} <= set(
            st.metrics
        )
    per_unit = ["streaming_prefill", "streaming_generate"]
    if revision != "legacy":
        per_unit.append("finalize_unit")
    log = [name for name, _ in b.duplex_wrapper.log]
    assert log == ["prepare", *per_unit * len(steps)]
    s.close()


# ---------------------------------------------------- the ways of misdriving the model, one by one


def test_exact_one_second_units_only(revision):
    """Item 2: a short unit would be answered 'audio not enough' after <unit> was fed."""
    b, s = prepared(revision)
    with pytest.raises(UnsupportedInput, match="16000"):
        s.step(DuplexInput(audio=quiet(0.25)))
    with pytest.raises(UnsupportedInput):
        s.step(DuplexInput(audio=quiet(1.5)))
    for u in units(quiet(), loud(), quiet()):
        s.step(u)
    w = b.duplex_wrapper
    assert w.refused_prefills == 0 and w.max_backlog <= 80  # the first unit's 1030 ms alignment
    s.close()


def test_stand_in_corrupts_where_the_model_would_on_short_and_long_prefills():
    b, s = prepared()
    w = b.duplex_wrapper
    s.step(DuplexInput(audio=quiet()))  # unit 0 (padded to 1035 ms by the model)
    refused = w.streaming_prefill(audio_waveform=quiet(0.25))
    assert refused["success"] is False and "audio not enough" in refused["reason"]
    with pytest.raises(StandInFault, match="inside an open unit"):
        w.streaming_prefill(audio_waveform=quiet(0.25))
    b2, s2 = prepared()
    s2.step(DuplexInput(audio=quiet()))
    with pytest.raises(StandInFault, match="lags"):
        b2.duplex_wrapper.streaming_prefill(audio_waveform=quiet(1.25))


def test_forced_listen_closes_the_speaking_turn(revision):
    """Item 3: force_listen mid-turn closes the turn; the model does not resume stale speech."""
    b, s = prepared(revision)
    steps = to_speech(s)
    assert not steps[-1].listen and steps[-1].text == SPEECH[0]
    forced = s.step(DuplexInput(audio=loud(), force_listen=True))  # barge-in
    assert forced.listen and forced.metrics["force_listen"] is True
    symbols = b.duplex_wrapper.decoder.symbols
    assert symbols[-4:] == ["<audio>", "<|turn_eos|>", "<|listen|>", "</unit>"]
    after = [s.step(u) for u in units(quiet(), quiet(), quiet())]
    assert after[0].text == SPEECH[0]  # a new turn (answering the barge-in), not the old one's tail
    assert after[1].text == SPEECH[1]
    s.close()


def test_interrupt_forces_the_next_unit_only(revision):
    b, s = prepared(revision)
    to_speech(s)
    s.interrupt()
    assert s.step(DuplexInput(audio=quiet())).listen
    assert b.duplex_wrapper.current_turn_ended is True
    assert s.step(DuplexInput(audio=quiet())).listen  # nothing heard since: keeps listening
    s.close()


def test_stand_in_resumes_stale_speech_when_a_forced_listen_leaves_the_turn_open():
    b, s = prepared("legacy")
    to_speech(s)
    w = b.duplex_wrapper
    w.force_listen_count = w._streaming_generate_count + 1  # forced, turn not closed
    assert s.step(DuplexInput(audio=quiet())).listen
    w.force_listen_count = 0
    stale = s.step(DuplexInput(audio=quiet()))
    assert not stale.listen and stale.text == SPEECH[1]  # the interrupted turn's next words


def test_system_prompt_is_wrapped_exactly_once(revision):
    """Item 4: raw text for a prepare that wraps it itself, markup for one that does not."""
    b, s = prepared(revision)
    first = b.duplex_wrapper.log[0][1]
    if revision == "demo":
        assert first["prefix_system_prompt"] == "<|im_start|>system\nBe brief.\n<|audio_start|>"
        assert first["suffix_system_prompt"] == "<|audio_end|><|im_end|>"
    else:
        assert first["prefix_system_prompt"] == "Be brief." and first["kwargs"] == []
    assert b.duplex_wrapper.system_prompt.count("<|im_start|>system") == 1
    s.close()


def test_stand_in_refuses_a_prompt_wrapped_twice():
    b = make_backend(duplex_prompt_format="wrapped")
    with pytest.raises(BackendError, match="wrapped twice"):
        b.open_duplex().prepare(DuplexConfig(system_prompt="hi", ref_audio=voice()))
    b = make_backend("demo", duplex_prompt_format="raw")
    with pytest.raises(BackendError, match="markup"):
        b.open_duplex().prepare(DuplexConfig(system_prompt="hi", ref_audio=voice()))


def test_finalize_unit_ends_every_unit():
    """Item 5: the method is finalize_unit (there is no 'finalize')."""
    b, s = prepared("published")
    w = b.duplex_wrapper
    assert not hasattr(w, "finalize")
    for u in units(quiet(), quiet()):
        s.step(u)
        assert not w.needs_finalize and w.decoder.symbols[-1] == "</unit>"
    w.streaming_prefill(audio_waveform=quiet())
    w.streaming_generate()
    with pytest.raises(RuntimeError, match="before finalize_unit"):
        w.streaming_prefill(audio_waveform=quiet())


def test_a_failed_generate_still_finalizes_the_unit(monkeypatch):
    b, s = prepared("published")
    w = b.duplex_wrapper
    real = w.streaming_generate

    def fails_after_deciding(**kwargs):
        real(**kwargs)
        raise RuntimeError("TTS blew up")

    monkeypatch.setattr(w, "streaming_generate", fails_after_deciding)
    with pytest.raises(InferenceError):
        s.step(DuplexInput(audio=quiet()))
    monkeypatch.undo()
    assert s.step(DuplexInput(audio=quiet())).listen  # the next unit runs
    s.close()


def test_the_demos_defaults(revision):
    """Item 6: listen for the first three units (force_listen_count=3), top_k 20."""
    b, s = prepared(revision)
    w = b.duplex_wrapper
    assert w.force_listen_count == 3
    steps = [s.step(u) for u in units(loud(), quiet(), quiet(), quiet(), quiet())]
    assert [st.listen for st in steps] == [True, True, True, False, False]
    generate = [kw for name, kw in w.log if name == "streaming_generate"][-1]
    assert (generate["top_k"], generate["temperature"], generate["top_p"]) == (20, 0.7, 0.8)
    assert generate["max_new_speak_tokens_per_chunk"] == 20
    assert generate["decode_mode"] == "sampling"
    if revision != "legacy":
        assert generate["length_penalty"] == 1.1
    s.close()


def test_listen_metrics_carry_vision_slices_and_tokens(revision):
    """Item 7 (spec/03): vision_slices / vision_tokens in the metrics."""
    b, s = prepared(revision, DuplexConfig(mode="video", ref_audio=voice()))
    one = s.step(DuplexInput(audio=quiet(), frames=[jpeg()]))
    assert one.metrics["vision_slices"] == 1 and one.metrics["vision_tokens"] == 64
    two = s.step(DuplexInput(audio=quiet(), frames=[jpeg(), jpeg()], max_slice_nums=2))
    assert two.metrics["vision_slices"] == 2 * 3 and two.metrics["vision_tokens"] == 6 * 64
    assert two.kv_cache_length - one.kv_cache_length >= 6 * 64
    none = s.step(DuplexInput(audio=quiet()))
    assert none.metrics["vision_slices"] == 0 and none.metrics["vision_tokens"] == 0
    prefill = [kw for name, kw in b.duplex_wrapper.log if name == "streaming_prefill"][1]
    assert prefill == {"audio": UNIT, "frames": 2, "max_slice_nums": 2}
    s.close()


# ---------------------------------------------------------------- sessions leave nothing behind


def test_session_settings_and_state_do_not_leak(revision):
    b = make_backend(revision)
    w = b.duplex_wrapper
    s1 = b.open_duplex()
    config = {"temperature": 0.3, "length_penalty": 1.5, "top_k": 5, "force_listen_count": 0}
    s1.prepare(
        DuplexConfig(
            ref_audio=voice(),
            tts_ref_audio=voice(1.0),
            config={**config, "max_new_speak_tokens_per_chunk": 8},
        )
    )
    assert w.force_listen_count == 0
    s1.step(DuplexInput(audio=quiet()))
    first = [kw for name, kw in w.log if name == "streaming_generate"][-1]
    assert (first["temperature"], first["top_k"]) == (0.3, 5)
    assert first["max_new_speak_tokens_per_chunk"] == 8
    wav1 = first["prompt_wav_path"]
    assert Path(wav1).exists()
    s1.close()
    assert not Path(wav1).exists()  # the session's voice file is gone
    assert b.model.token2wav_cache is None
    tok = b.model.tts.audio_tokenizer
    assert tok.stream_cache is None and tok.cache is None and tok.hift_cache_dict is None
    assert w.decoder.get_cache_length() == 0 and w.audio_buffer.size == 0
    assert w.is_session_stop_set()  # stopped; the next prepare clears it

    s2 = b.open_duplex()
    s2.prepare(DuplexConfig(ref_audio=voice(0.5)))
    assert w.force_listen_count == 3
    assert s2.step(DuplexInput(audio=quiet())).listen
    gen = [kw for name, kw in w.log if name == "streaming_generate"][-1]
    assert (gen["temperature"], gen["top_k"], gen["max_new_speak_tokens_per_chunk"]) == (
        0.7,
        20,
        20,
    )
    assert gen["prompt_wav_path"] != wav1
    s2.close()


def test_duplex_without_any_voice_and_tts_is_invalid():
    b = make_backend()
    with pytest.raises(UnsupportedInput):
        b.open_duplex().prepare(DuplexConfig())  # TTS on, no voice, no default voice
    s2 = b.open_duplex()  # the backend is clean and usable
    s2.prepare(DuplexConfig(ref_audio=voice()))
    s2.close()


def test_text_only_worker_speaks_text(revision):
    b, s = prepared(revision, DuplexConfig(system_prompt="hi"), init_tts=False)
    assert b.duplex_wrapper.log[0][1]["prefix_system_prompt"].endswith("hi")
    spoken = [st for st in to_speech(s) if not st.listen]
    assert spoken and all(st.audio is None for st in spoken)
    s.close()


def test_bad_and_unknown_config_values():
    b = make_backend()
    with pytest.raises(UnsupportedInput) as err:
        b.open_duplex().prepare(DuplexConfig(ref_audio=voice(), config={"temperature": "hot"}))
    assert err.value.field_name == "config.temperature"
    s = b.open_duplex()
    s.prepare(DuplexConfig(ref_audio=voice(), config={"some_other_backend_knob": 3}))
    s.close()


def test_context_window_stops_before_it_is_crossed():
    b, s = prepared(max_context_tokens=400)
    steps = []
    for _ in range(100):
        st = s.step(DuplexInput(audio=quiet()))
        steps.append(st)
        if st.kv_cache_length >= b.max_context_tokens:
            break
    assert steps[-1].kv_cache_length >= 400 and steps[-1].metrics.get("context_full")
    real = [st for st in steps if not st.metrics.get("skipped")]
    assert all(st.kv_cache_length < 400 for st in real)  # no model step crossed the limit
    generated = [n for n, _ in b.duplex_wrapper.log].count("streaming_generate")
    assert generated == len(real)
    assert s.step(DuplexInput(audio=quiet())).metrics.get("skipped")  # stays stopped
    s.close()


def test_8192_default_window():
    b, s = prepared()
    assert b.max_context_tokens == 8192
    b.duplex_wrapper.decoder.length = 8192 - 50  # a long conversation
    st = s.step(DuplexInput(audio=quiet()))
    assert st.listen and st.kv_cache_length == 8192 and st.metrics["context_full"]
    assert "streaming_prefill" not in [n for n, _ in b.duplex_wrapper.log]
    s.close()


def test_closed_and_stale_sessions():
    b, s = prepared()
    s.close()
    s.close()
    with pytest.raises(BackendError):
        s.step(DuplexInput(audio=quiet()))
    s1 = b.open_duplex()
    s1.prepare(DuplexConfig(ref_audio=voice()))
    s2 = b.open_duplex()  # s1 was never closed
    s2.prepare(DuplexConfig(ref_audio=voice()))
    with pytest.raises(BackendError):
        s1.step(DuplexInput(audio=quiet()))
    assert s2.step(DuplexInput(audio=quiet())).listen
    s2.close()


# ---------------------------------------------------------------- rollover


def test_a_rollover_primes_the_same_wrapper_with_the_conversation(revision):
    """``reprime``: ``prepare`` again on the live wrapper, the session's system prompt and
    voices, the conversation behind the model's own marker inside the system text."""
    from inference import HistoryTurn

    b, s = prepared(revision)
    w = b.duplex_wrapper
    steps = to_speech(s) + [s.step(u) for u in units(quiet(), quiet(), quiet())]
    assert any(not st.listen for st in steps)
    kv_before = steps[-1].kv_cache_length
    history = [HistoryTurn("assistant", "".join(SPEECH))]
    config = DuplexConfig(system_prompt="Be brief.", ref_audio=voice(), history=history)
    length = s.reprime(config)
    assert 0 < length < kv_before
    prepares = [kw for name, kw in w.log if name == "prepare"]
    assert len(prepares) == 2 and w.primes == 2
    prefix = prepares[-1]["prefix_system_prompt"]
    body = "Be brief.\n\nprevious: " + "".join(SPEECH)
    if revision == "demo":
        assert prefix == "<|im_start|>system\n" + body + "\n<|audio_start|>"
        assert prepares[-1]["suffix_system_prompt"] == "<|audio_end|><|im_end|>"
    else:
        assert prefix == body
    assert w.system_prompt.count("<|im_start|>system") == 1
    assert "[audio embedding]" in w.system_prompt  # the voice was fed again
    # the session goes on: the next units run on the fresh cache, and the model speaks again
    after = to_speech(s)
    assert all(st.kv_cache_length < kv_before for st in after)
    assert any(not st.listen for st in after)
    s.close()


def test_stand_in_refuses_a_rollover_prime_with_another_voice_or_prompt():
    from inference import HistoryTurn

    history = [HistoryTurn("assistant", "hello")]
    b, s = prepared("published")
    with pytest.raises(StandInFault, match="reference voice"):
        b.duplex_wrapper.prepare(
            prefix_system_prompt="Be brief.\n\nprevious: hello",
            ref_audio=voice(3.0),
            prompt_wav_path=s._prompt_wav_path,  # the session's own file
        )
    b, s = prepared("published")
    with pytest.raises(BackendError, match="system prompt"):
        s.reprime(DuplexConfig(system_prompt="Be long.", ref_audio=voice(), history=history))
    b, s = prepared("published")
    s._prompt_wav_path = None  # a prime that forgets the TTS voice
    with pytest.raises(BackendError, match="TTS voice"):
        s.reprime(DuplexConfig(system_prompt="Be brief.", ref_audio=voice(), history=history))


def test_stand_in_refuses_earlier_content_after_the_voice():
    b = make_backend("demo")
    w = b.duplex_wrapper
    with pytest.raises(StandInFault, match="after the reference voice"):
        w.prepare(
            prefix_system_prompt="<|im_start|>system\nBe brief.\n<|audio_start|>\n\nprevious: hi",
            suffix_system_prompt="<|audio_end|><|im_end|>",
            ref_audio=voice(),
        )


def test_a_rollover_does_not_force_the_first_units_to_listen_again():
    b, s = prepared("legacy", duplex_options={"force_listen_count": 3})
    w = b.duplex_wrapper
    to_speech(s)
    s.reprime(DuplexConfig(system_prompt="Be brief.", ref_audio=voice()))
    assert w.force_listen_count == 0
    s.close()
