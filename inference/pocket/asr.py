"""Speech to text: Whisper tiny.en through faster-whisper (CTranslate2, int8 on CPU)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from inference.pocket.assets import require


class SpeechRecognizer:
    """Transcribes 16 kHz mono float32 speech to English text."""

    def __init__(self, model_dir: str | Path, threads: int = 2, beam_size: int = 1) -> None:
        fw = require("faster_whisper", "faster-whisper")
        self._model = fw.WhisperModel(
            str(model_dir), device="cpu", compute_type="int8", cpu_threads=threads
        )
        self._beam_size = beam_size
        self._lock = threading.Lock()

    def transcribe(self, samples: np.ndarray) -> str:
        """The text spoken in ``samples`` (16 kHz float32); "" for silence or too-short input."""
        audio = np.asarray(samples, dtype=np.float32).reshape(-1)
        if audio.size < 1600:  # < 0.1 s: nothing Whisper can use
            return ""
        with self._lock:
            segments, _info = self._model.transcribe(
                audio,
                language="en",
                beam_size=self._beam_size,
                condition_on_previous_text=False,
                vad_filter=False,
                without_timestamps=True,
            )
            return " ".join(s.text.strip() for s in segments if s.text.strip()).strip()
