"""Speech to text: Whisper tiny.en through faster-whisper (CTranslate2, int8 on CPU).

Whisper's encoder always reads 30 s of audio; for a short question that is most of the time a
transcription takes. An utterance is short and followed by silence, so the
encoder here reads only the utterance plus ``margin_s`` of silence, and the rest of the 30 s
window is filled with the encoder's output for silence (computed once at load). The decoder
thus sees what it was trained on: speech, then silence to the end of the window. Whisper
decoding the short window alone loops ("What is 2 plus 2? What is 2 plus 2? ..."); with the
silence spliced in, transcripts match the full 30 s encoding (docs/POCKET.md). A transcript
that still looks repetitive (gzip ratio above 2.4, Whisper's own fallback test) is redone on
the full window.
"""

from __future__ import annotations

import threading
import zlib
from pathlib import Path

import numpy as np

from inference.pocket.assets import require

SAMPLE_RATE = 16_000
HOP = 160  # samples per mel frame
WINDOW_FRAMES = 3000  # 30 s: the encoder's full input
COMPRESSION_RATIO_LIMIT = 2.4  # Whisper's threshold for a looping transcript
NO_SPEECH_LIMIT = 0.6  # Whisper's "no speech" threshold, with a low average log-probability
LOGPROB_LIMIT = -1.0


def _compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / max(1, len(zlib.compress(data)))


class SpeechRecognizer:
    """Transcribes 16 kHz mono float32 speech to English text."""

    def __init__(
        self,
        model_dir: str | Path,
        threads: int = 2,
        beam_size: int = 1,
        margin_s: float = 2.0,
    ) -> None:
        fw = require("faster_whisper", "faster-whisper")
        self._ct2 = require("ctranslate2", "ctranslate2")
        tokenizer_mod = require("faster_whisper.tokenizer", "faster-whisper")
        self._model = fw.WhisperModel(
            str(model_dir), device="cpu", compute_type="int8", cpu_threads=threads
        )
        self._tokenizer = tokenizer_mod.Tokenizer(
            self._model.hf_tokenizer,
            self._model.model.is_multilingual,
            task="transcribe",
            language="en",
        )
        self._prompt = self._model.get_prompt(self._tokenizer, [], without_timestamps=True)
        self._beam_size = beam_size
        self._margin_frames = int(margin_s * SAMPLE_RATE / HOP)
        self._lock = threading.Lock()
        silence = np.zeros(WINDOW_FRAMES * HOP, dtype=np.float32)
        self._silence_encoding = np.array(self._encode(self._features(silence, WINDOW_FRAMES)))
        self.last_window_s = 0.0  # encoder window of the last transcription (30.0: full)

    def transcribe(self, samples: np.ndarray, full_window: bool = False) -> str:
        """The text spoken in ``samples`` (16 kHz float32); "" for silence or too-short input.

        ``full_window``: encode all 30 s as Whisper normally does (slower; for comparison).
        """
        audio = np.asarray(samples, dtype=np.float32).reshape(-1)
        if audio.size < 1600:  # < 0.1 s: nothing Whisper can use
            return ""
        frames = -(-audio.size // HOP) + self._margin_frames
        with self._lock:
            if frames < WINDOW_FRAMES and not full_window:
                text, ok = self._decode(audio, frames + frames % 2)
                self.last_window_s = (frames + frames % 2) * HOP / SAMPLE_RATE
                if ok:
                    return text
            text, _ok = self._decode(audio, WINDOW_FRAMES)
            self.last_window_s = WINDOW_FRAMES * HOP / SAMPLE_RATE
            return text

    def _features(self, audio: np.ndarray, frames: int) -> np.ndarray:
        padded = np.zeros(frames * HOP, dtype=np.float32)
        padded[: min(audio.size, padded.size)] = audio[: padded.size]
        mel = self._model.feature_extractor(padded)[:, :frames]
        return np.ascontiguousarray(mel[None], dtype=np.float32)

    def _encode(self, features: np.ndarray):  # type: ignore[no-untyped-def]
        return self._model.model.encode(self._ct2.StorageView.from_array(features), to_cpu=True)

    def _decode(self, audio: np.ndarray, frames: int) -> tuple[str, bool]:
        """(text, trustworthy) from an encoder window of ``frames`` mel frames."""
        encoded = self._encode(self._features(audio, min(frames, WINDOW_FRAMES)))
        if frames < WINDOW_FRAMES:
            full = self._silence_encoding.copy()
            part = np.asarray(encoded)
            full[:, : part.shape[1]] = part
            encoded = self._ct2.StorageView.from_array(full)
        result = self._model.model.generate(
            encoded,
            [self._prompt],
            beam_size=self._beam_size,
            max_length=224,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=[-1],
        )[0]
        eot = self._tokenizer.eot
        tokens = [t for t in result.sequences_ids[0] if t < eot]
        text = self._tokenizer.decode(tokens).strip()
        score = result.scores[0] if result.scores else 0.0
        if result.no_speech_prob > NO_SPEECH_LIMIT and score < LOGPROB_LIMIT:
            return "", True
        return text, _compression_ratio(text) <= COMPRESSION_RATIO_LIMIT
