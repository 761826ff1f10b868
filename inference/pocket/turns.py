"""Where the user's speech starts and ends, at the VAD's 32 ms resolution, as audio streams in.

Client chunks (250 ms to 1 s) are cut into the VAD's windows, so the end of an utterance is
found inside the chunk that carries it, not at a chunk boundary: the decision needs only
``end_silence_s`` of silence after the last voiced window. The rule follows Silero's own
``get_speech_timestamps``: a window at or above ``threshold`` is speech; silence starts at the
first window below ``threshold - 0.15`` and is reset only by a window at or above ``threshold``.

A shorter silence, ``speculate_after_s``, reports a pause with the utterance so far: work on an
answer can start while it is not yet known whether the user goes on (``SpeechResumed``) or has
finished (``SpeechEnded``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inference.pocket.vad import WINDOW, SileroVAD


@dataclass(slots=True)
class SpeechStarted:
    """Speech was confirmed; ``at`` is its first sample (stream position, pre-roll excluded)."""

    at: int
    decided_at: int


@dataclass(slots=True)
class SpeechEnded:
    """An utterance is complete: its audio (with ``pad_s`` either side) and where it ended."""

    audio: np.ndarray
    start: int  # first sample of the speech (stream position)
    end: int  # first sample after the last voiced window
    decided_at: int  # stream position at which the silence was long enough
    forced: bool = False  # cut at ``max_utterance_s`` rather than ended by silence


@dataclass(slots=True)
class SpeechPaused:
    """``speculate_after_s`` of silence after speech: the utterance so far, perhaps the whole."""

    audio: np.ndarray
    start: int
    end: int
    decided_at: int


@dataclass(slots=True)
class SpeechResumed:
    """Speech again after a ``SpeechPaused``: that utterance goes on."""

    at: int


TurnEvent = SpeechStarted | SpeechPaused | SpeechResumed | SpeechEnded


class TurnDetector:
    """Finds utterances in one session's input stream; keeps only the audio it may still need."""

    def __init__(
        self,
        vad: SileroVAD,
        threshold: float = 0.5,
        min_speech_s: float = 0.096,
        end_silence_s: float = 0.4,
        pad_s: float = 0.2,
        max_utterance_s: float = 28.0,
        speculate_after_s: float | None = None,
        sample_rate: int = 16_000,
    ) -> None:
        self._stream = vad.stream()
        self.threshold = threshold
        self.neg_threshold = max(0.01, threshold - 0.15)
        self._min_speech = max(1, round(min_speech_s * sample_rate / WINDOW))  # windows
        self._end_silence = int(end_silence_s * sample_rate)
        self._pad = int(pad_s * sample_rate)
        self._max_utterance = int(max_utterance_s * sample_rate)
        spec = speculate_after_s
        self._speculate = int(spec * sample_rate) if spec and spec < end_silence_s else None
        self._paused = False  # a SpeechPaused was reported for the current silence
        self.sample_rate = sample_rate
        self._audio = np.zeros(0, dtype=np.float32)
        self._audio_start = 0  # stream position of self._audio[0]
        self._received = 0  # samples pushed so far
        self._voiced_run = 0
        self._run_start = 0
        self.in_speech = False
        self._start = 0
        self._last_voiced = 0  # end of the last window at or above threshold
        self._silence_from: int | None = None

    @property
    def position(self) -> int:
        """Samples received so far (the stream position of the next sample)."""
        return self._received

    @property
    def buffered(self) -> int:
        """Samples of audio held (the speech in progress, or a pre-roll)."""
        return int(self._audio.size)

    def push(self, audio: np.ndarray) -> list[TurnEvent]:
        """Take the next piece of the stream; return what it started or ended, in order."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        self._audio = np.concatenate([self._audio, audio])
        self._received += audio.size
        first = self._stream.samples_scored
        probs = self._stream.push(audio)
        events: list[TurnEvent] = []
        for i, p in enumerate(probs):
            begin = first + i * WINDOW
            event = self._window(begin, begin + WINDOW, float(p))
            if event is not None:
                events.append(event)
        self._trim()
        return events

    def reset(self) -> None:
        """Forget the speech in progress (the VAD's own state goes on with the stream)."""
        self.in_speech = False
        self._voiced_run = 0
        self._silence_from = None
        self._paused = False

    def _window(self, begin: int, end: int, p: float) -> TurnEvent | None:
        if not self.in_speech:
            if p >= self.threshold:
                if self._voiced_run == 0:
                    self._run_start = begin
                self._voiced_run += 1
                if self._voiced_run >= self._min_speech:
                    self.in_speech = True
                    self._start, self._last_voiced, self._silence_from = self._run_start, end, None
                    return SpeechStarted(at=self._start, decided_at=end)
            elif p < self.neg_threshold:
                self._voiced_run = 0
            return None
        if p >= self.threshold:
            self._last_voiced, self._silence_from = end, None
            if self._paused:
                self._paused = False
                return SpeechResumed(at=begin)
        elif p < self.neg_threshold and self._silence_from is None:
            self._silence_from = begin
        if self._silence_from is not None:
            silent = end - self._silence_from
            if silent >= self._end_silence:
                return self._ended(self._silence_from, end, forced=False)
            if self._speculate is not None and not self._paused and silent >= self._speculate:
                self._paused = True
                return SpeechPaused(
                    audio=self._cut(self._silence_from),
                    start=self._start,
                    end=self._silence_from,
                    decided_at=end,
                )
        if end - self._start >= self._max_utterance:
            return self._ended(end, end, forced=True)
        return None

    def _cut(self, speech_end: int) -> np.ndarray:
        """The utterance's audio, ``pad_s`` either side of the speech (as far as received)."""
        lo = max(self._audio_start, self._start - self._pad)
        hi = min(self._audio_start + self._audio.size, speech_end + self._pad)
        return self._audio[lo - self._audio_start : hi - self._audio_start].copy()

    def _ended(self, speech_end: int, decided_at: int, forced: bool) -> SpeechEnded:
        audio = self._cut(speech_end)
        self.reset()
        return SpeechEnded(
            audio=audio, start=self._start, end=speech_end, decided_at=decided_at, forced=forced
        )

    def _trim(self) -> None:
        """Keep the speech in progress (from its pre-roll) or just a pre-roll's worth."""
        if self.in_speech:
            keep_from = self._start - self._pad
        elif self._voiced_run:
            keep_from = self._run_start - self._pad
        else:
            keep_from = self._received - self._pad - WINDOW * self._min_speech
        drop = min(max(0, keep_from - self._audio_start), self._audio.size)
        if drop:
            self._audio = self._audio[drop:]
            self._audio_start += drop
