"""Serialisation of internal events and of audio payloads."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def loads(data: bytes | str) -> Any:
    """Parse JSON bytes or text."""
    return orjson.loads(data)


def pcm_to_b64(samples: np.ndarray) -> str:
    """Base64 of little-endian float32 PCM."""
    return base64.b64encode(np.ascontiguousarray(samples, dtype="<f4").tobytes()).decode("ascii")


def b64_to_pcm(data: str | bytes) -> np.ndarray:
    """Float32 PCM from base64 (no validation beyond what base64 and numpy do)."""
    return np.frombuffer(base64.b64decode(data), dtype="<f4").astype(np.float32)


def bytes_to_pcm(raw: bytes) -> np.ndarray:
    """Float32 PCM from raw little-endian bytes."""
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)
