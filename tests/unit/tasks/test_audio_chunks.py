"""tasks/audio_chunks.py: protocol-sized speech deltas."""

from __future__ import annotations

import numpy as np

from tasks.audio_chunks import AudioChunker


def test_chunker_first_short_middle_exact_last_short() -> None:
    c = AudioChunker(size=100)
    assert [p.size for p in c.push(np.ones(30, np.float32))] == [30]  # first goes out at once
    assert [p.size for p in c.push(np.ones(250, np.float32))] == [100, 100]
    assert c.push(None) == []
    rest = c.flush()
    assert rest is not None and rest.size == 50
    assert c.flush() is None
    assert [p.size for p in c.push(np.ones(230, np.float32))] == [100, 100]  # a new turn
