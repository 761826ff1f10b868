"""Voice-activity detection on ~1 s chunks: frame energy, no model, works offline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class EnergyVAD:
    """A chunk is voiced when enough of its 30 ms frames are louder than ``threshold`` (RMS).

    ``threshold`` 0.01 is about -40 dBFS: quiet room noise stays below it, normal speech
    (RMS 0.03-0.3) is well above it.
    """

    threshold: float = 0.01
    min_voiced_ratio: float = 0.1
    sample_rate: int = 16_000
    frame_s: float = 0.03

    def voiced_ratio(self, samples: np.ndarray) -> float:
        """The fraction of frames above the energy threshold."""
        audio = np.asarray(samples, dtype=np.float32).reshape(-1)
        frame = max(1, int(self.sample_rate * self.frame_s))
        n = audio.size // frame
        if n == 0:
            return 0.0
        frames = audio[: n * frame].reshape(n, frame)
        rms = np.sqrt(np.mean(frames * frames, axis=1))
        return float(np.mean(rms > self.threshold))

    def is_speech(self, samples: np.ndarray) -> bool:
        """Whether this chunk contains speech."""
        return self.voiced_ratio(samples) >= self.min_voiced_ratio
