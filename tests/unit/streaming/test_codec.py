"""streaming/codec.py: compact JSON for what crosses Redis."""

from __future__ import annotations

import numpy as np

from streaming.codec import dumps, loads


def test_round_trip_with_numpy() -> None:
    data = dumps({"a": np.arange(3, dtype=np.int32), "b": np.float32(0.25), "c": "x"})
    assert isinstance(data, bytes) and b" " not in data
    assert loads(data) == {"a": [0, 1, 2], "b": 0.25, "c": "x"}
    assert loads(data.decode()) == loads(data)
