"""Audio formats in one place: float32 PCM and its base64 wire form, WAV files, resampling.

Every protocol in this service moves mono float32 PCM (16 kHz in, 24 kHz out) as base64 of the
raw little-endian bytes. Files are read with ``soundfile`` (libsndfile: WAV of any encoding,
FLAC, OGG) and resampled with ``soxr``; both are small, so the gateway can validate what
clients send without an ML stack.
"""

from __future__ import annotations

import binascii
import io
from pathlib import Path
from typing import Any

import numpy as np
import pybase64
import soundfile
import soxr

INPUT_RATE = 16_000
OUTPUT_RATE = 24_000


class AudioFormatError(ValueError):
    """The bytes are not audio in the format they claim to be."""


# --------------------------------------------------------------------------- raw PCM


def to_mono_float32(samples: Any) -> np.ndarray:
    """Anything array-like (numpy, a torch tensor, a list) as a flat float32 numpy array."""
    if samples is None:
        return np.zeros(0, dtype=np.float32)
    if hasattr(samples, "detach"):  # a torch.Tensor, without importing torch
        samples = samples.detach().float().cpu().numpy()
    return np.asarray(samples, dtype=np.float32).reshape(-1)


def pcm_bytes(samples: Any) -> bytes:
    """Little-endian float32 bytes of mono PCM."""
    return np.ascontiguousarray(to_mono_float32(samples), dtype="<f4").tobytes()


def bytes_to_pcm(raw: bytes) -> np.ndarray:
    """Float32 PCM from raw little-endian bytes (a trailing partial sample is an error)."""
    if len(raw) % 4:
        raise AudioFormatError("float32 PCM byte length is not a multiple of 4")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def pcm_to_b64(samples: Any) -> str:
    """The wire form: base64 of little-endian float32 PCM ('' for no audio)."""
    if samples is None:
        return ""
    return pybase64.b64encode(pcm_bytes(samples)).decode("ascii")


def b64_decode(data: str | bytes) -> bytes:
    """Strict base64 (no stray characters), as AudioFormatError when it is not.

    ``pybase64`` (SIMD) decodes an input chunk for a small fraction of the standard library's
    CPU; the gateway validates every chunk of every session, so this is per-session CPU."""
    try:
        return pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioFormatError(f"base64 decode failed: {exc}") from None


def b64_to_pcm(data: str | bytes) -> np.ndarray:
    """Float32 PCM from its wire form."""
    return bytes_to_pcm(b64_decode(data))


def pcm16_to_float32(raw: bytes) -> np.ndarray:
    """Float32 PCM from little-endian signed 16-bit PCM (the OpenAI Realtime ``audio/pcm``)."""
    if len(raw) % 2:
        raise AudioFormatError("pcm16 byte length is not a multiple of 2")
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def float32_to_pcm16(samples: Any) -> bytes:
    """Little-endian signed 16-bit PCM of float32 PCM (clipped to [-1, 1])."""
    pcm = np.clip(to_mono_float32(samples), -1.0, 1.0)
    out: bytes = np.round(pcm * 32767.0).astype("<i2").tobytes()
    return out


# --------------------------------------------------------------------------- files


def is_wav(data: bytes) -> bool:
    """True when ``data`` starts with a RIFF/WAVE header."""
    return len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE"


def read_audio(source: bytes | str | Path) -> tuple[np.ndarray, int]:
    """Decode an audio file (bytes or a path) to mono float32 and its sample rate."""
    try:
        handle: Any = io.BytesIO(source) if isinstance(source, bytes) else str(source)
        samples, rate = soundfile.read(handle, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioFormatError(f"not a readable audio file: {exc}") from None
    if rate <= 0 or samples.shape[1] < 1:
        raise AudioFormatError("audio file has no channels or no sample rate")
    return samples.mean(axis=1).astype(np.float32), int(rate)


def wav_bytes(samples: Any, rate: int, subtype: str = "PCM_16") -> bytes:
    """A mono WAV file (16-bit PCM by default; ``FLOAT`` keeps float32 exactly)."""
    buf = io.BytesIO()
    pcm = to_mono_float32(samples)
    if subtype.startswith("PCM"):
        pcm = np.clip(pcm, -1.0, 1.0)
    soundfile.write(buf, pcm, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def write_wav(path: str | Path, samples: Any, rate: int, subtype: str = "PCM_16") -> None:
    """Write a mono WAV file."""
    Path(path).write_bytes(wav_bytes(samples, rate, subtype))


# --------------------------------------------------------------------------- rates


def resample(samples: Any, rate_in: int, rate_out: int) -> np.ndarray:
    """Resample mono float32 audio (soxr, high quality)."""
    pcm = to_mono_float32(samples)
    if rate_in == rate_out or pcm.size == 0:
        return pcm
    return np.asarray(soxr.resample(pcm, rate_in, rate_out), dtype=np.float32)


def load_voice(source: bytes | str | Path, rate: int = INPUT_RATE) -> np.ndarray:
    """A reference voice file as mono float32 at ``rate``."""
    samples, file_rate = read_audio(source)
    return resample(samples, file_rate, rate)


def pcm_or_wav_to_16k(data: bytes) -> np.ndarray:
    """Reference audio as clients send it: a WAV file (any rate) or raw float32 PCM at 16 kHz."""
    if is_wav(data):
        return load_voice(data, INPUT_RATE)
    return bytes_to_pcm(data)
