"""Small audio helpers shared by the model backends (numpy only, no ML stack).

WAV files are read and written with the standard library so that the backends need neither
soundfile nor librosa just to move a reference voice around.
"""

from __future__ import annotations

import base64
import io
import struct
import wave
from pathlib import Path
from typing import Any

import numpy as np


def to_mono_float32(samples: Any) -> np.ndarray:
    """Anything array-like (numpy, torch tensor, list) as a flat float32 numpy array."""
    if samples is None:
        return np.zeros(0, dtype=np.float32)
    if hasattr(samples, "detach"):  # torch.Tensor, without importing torch
        samples = samples.detach()
        if hasattr(samples, "float"):
            samples = samples.float()
        samples = samples.cpu().numpy()
    return np.asarray(samples, dtype=np.float32).reshape(-1)


def pcm_to_b64(samples: np.ndarray) -> str:
    """Mono float32 PCM (little endian) as base64, the wire format of the realtime protocols."""
    return base64.b64encode(np.asarray(samples, dtype="<f4").tobytes()).decode("ascii")


def b64_to_pcm(data: str) -> np.ndarray:
    raw = base64.b64decode(data, validate=True)
    if len(raw) % 4:
        raise ValueError("audio payload is not float32 PCM (length is not a multiple of 4)")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def resample_linear(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Plain linear-interpolation resampling; good enough for a reference voice prompt."""
    samples = to_mono_float32(samples)
    if src_rate == dst_rate or samples.size == 0:
        return samples
    n_out = max(1, int(round(samples.size * dst_rate / src_rate)))
    x_old = np.linspace(0.0, 1.0, num=samples.size, endpoint=False)
    x_new = np.linspace(0.0, 1.0, num=n_out, endpoint=False)
    return np.interp(x_new, x_old, samples).astype(np.float32)


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write mono 16-bit PCM."""
    pcm = np.clip(to_mono_float32(samples), -1.0, 1.0)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes((pcm * 32767.0).astype("<i2").tobytes())


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a PCM (8/16/24/32-bit int) or IEEE-float WAV file as mono float32."""
    data = Path(path).read_bytes()
    return read_wav_bytes(data)


def read_wav_bytes(data: bytes) -> tuple[np.ndarray, int]:
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE file")
    pos = 12
    fmt: tuple[int, int, int, int] | None = None
    payload: bytes | None = None
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        (size,) = struct.unpack("<I", data[pos + 4 : pos + 8])
        body = data[pos + 8 : pos + 8 + size]
        if chunk_id == b"fmt ":
            tag, channels, rate = struct.unpack("<HHI", body[:8])
            (bits,) = struct.unpack("<H", body[14:16])
            if tag == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: real tag in the GUID
                (tag,) = struct.unpack("<H", body[24:26])
            fmt = (tag, channels, rate, bits)
        elif chunk_id == b"data":
            payload = body
        pos += 8 + size + (size & 1)
    if fmt is None or payload is None:
        raise ValueError("WAV file without fmt or data chunk")
    tag, channels, rate, bits = fmt
    if tag == 3 and bits == 32:
        samples = np.frombuffer(payload[: len(payload) // 4 * 4], dtype="<f4").astype(np.float32)
    elif tag == 3 and bits == 64:
        samples = np.frombuffer(payload[: len(payload) // 8 * 8], dtype="<f8").astype(np.float32)
    elif tag == 1 and bits == 16:
        samples = (
            np.frombuffer(payload[: len(payload) // 2 * 2], dtype="<i2").astype(np.float32)
            / 32768.0
        )
    elif tag == 1 and bits == 32:
        samples = (
            np.frombuffer(payload[: len(payload) // 4 * 4], dtype="<i4").astype(np.float32)
            / 2147483648.0
        )
    elif tag == 1 and bits == 8:
        samples = (np.frombuffer(payload, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif tag == 1 and bits == 24:
        raw = np.frombuffer(payload[: len(payload) // 3 * 3], dtype=np.uint8).reshape(-1, 3)
        ints = (
            raw[:, 0].astype(np.int32)
            | (raw[:, 1].astype(np.int32) << 8)
            | (raw[:, 2].astype(np.int32) << 16)
        )
        ints = np.where(ints >= 1 << 23, ints - (1 << 24), ints)
        samples = ints.astype(np.float32) / float(1 << 23)
    else:
        raise ValueError(f"unsupported WAV encoding (format tag {tag}, {bits} bits)")
    if channels > 1:
        samples = samples[: samples.size // channels * channels].reshape(-1, channels).mean(axis=1)
    return samples.astype(np.float32), int(rate)


def load_voice(path: str | Path, sample_rate: int = 16_000) -> np.ndarray:
    """A reference voice file as mono float32 at ``sample_rate``."""
    samples, rate = read_wav(path)
    return resample_linear(samples, rate, sample_rate)


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    pcm = np.clip(to_mono_float32(samples), -1.0, 1.0)
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes((pcm * 32767.0).astype("<i2").tobytes())
    return buf.getvalue()
