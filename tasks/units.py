"""Client chunks of any length into the exact input units a backend's duplex step consumes.

The public API accepts chunks of any length (the older dialect's of 250 ms and up); MiniCPM-o
consumes exactly one second per step (``Backend.unit_samples``). A unit carries the frames of the
chunks whose audio starts in it (the newest ``max_frames``), a forced listen if any of them asked
for one, and the input id of the chunk that completed it. Without a unit size every chunk is a
unit, as it comes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class Unit:
    """One backend step's input."""

    input_id: str  # the chunk that completed the unit
    audio: np.ndarray
    frames: list[bytes] = field(default_factory=list)
    force_listen: bool = False
    max_slice_nums: int = 1


class UnitAssembler:
    """Buffers one session's input audio and cuts it into units."""

    def __init__(self, unit_samples: int | None, max_frames: int = 8) -> None:
        if unit_samples is not None and unit_samples <= 0:
            raise ValueError("unit_samples must be positive")
        self.unit_samples = unit_samples
        self.max_frames = max(0, max_frames)
        self._parts: list[np.ndarray] = []
        self._pending = 0
        self._frames: list[bytes] = []
        self._force_listen = False
        self._max_slice_nums = 1

    @property
    def pending_samples(self) -> int:
        """Samples waiting for their unit to fill."""
        return self._pending

    def interrupt(self) -> None:
        """A forced listen for the unit being filled (an interrupt needs no full unit to act)."""
        self._force_listen = True

    def push(
        self,
        audio: np.ndarray,
        input_id: str,
        frames: list[bytes] | None = None,
        force_listen: bool = False,
        max_slice_nums: int = 1,
    ) -> list[Unit]:
        """Add one chunk; return the units it completes (none, one, or several)."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        frames = list(frames or [])
        if self.unit_samples is None:
            return [Unit(input_id, audio, frames, force_listen, max_slice_nums)]
        if frames:
            self._frames = (self._frames + frames)[-self.max_frames :] if self.max_frames else []
            self._max_slice_nums = max_slice_nums
        elif not self._frames:
            self._max_slice_nums = max_slice_nums
        self._force_listen = self._force_listen or force_listen
        self._parts.append(audio)
        self._pending += audio.size
        units: list[Unit] = []
        while self._pending >= self.unit_samples:
            units.append(self._cut(input_id))
        return units

    def _cut(self, input_id: str) -> Unit:
        size = self.unit_samples or 0
        buffered = np.concatenate(self._parts) if len(self._parts) > 1 else self._parts[0]
        unit = Unit(
            input_id=input_id,
            audio=buffered[:size],
            frames=self._frames,
            force_listen=self._force_listen,
            max_slice_nums=self._max_slice_nums,
        )
        rest = buffered[size:]
        self._parts = [rest] if rest.size else []
        self._pending = int(rest.size)
        self._frames, self._force_listen = [], False
        return unit
