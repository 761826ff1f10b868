"""Cut a response's output audio into protocol-sized deltas.

Middle deltas are exactly one second (24000 samples); the first may be shorter (sent as soon as it
exists) and the last, flushed at the end of the turn, may be shorter too.
"""

from __future__ import annotations

import numpy as np

SAMPLES_PER_DELTA = 24_000


class AudioChunker:
    """Accumulates a response's audio and hands out protocol-sized pieces."""

    def __init__(self, size: int = SAMPLES_PER_DELTA) -> None:
        self.size = size
        self.buffer = np.zeros(0, dtype=np.float32)
        self.first = True

    def push(self, audio: np.ndarray | None) -> list[np.ndarray]:
        """Add audio; return the pieces that are ready."""
        if audio is None or audio.size == 0:
            return []
        audio = audio.astype(np.float32, copy=False)
        out: list[np.ndarray] = []
        if self.first:
            self.first = False
            out.append(audio[: self.size])
            audio = audio[self.size :]
        self.buffer = np.concatenate([self.buffer, audio]) if self.buffer.size else audio
        while self.buffer.size >= self.size:
            out.append(self.buffer[: self.size])
            self.buffer = self.buffer[self.size :]
        return out

    def flush(self) -> np.ndarray | None:
        """The remainder at the end of a turn (None when empty); resets for the next turn."""
        rest = self.buffer if self.buffer.size else None
        self.buffer = np.zeros(0, dtype=np.float32)
        self.first = True
        return rest
