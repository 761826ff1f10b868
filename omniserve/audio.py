"""Audio helpers shared by the gateway (validation) and the workers (decoding); numpy only."""

from __future__ import annotations

import struct

import numpy as np


class AudioFormatError(ValueError):
    """The bytes are not audio we understand."""


def is_wav(data: bytes) -> bool:
    """True when ``data`` starts with a RIFF/WAVE header."""
    return len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE"


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Decode a WAV file (PCM 8/16/24/32-bit or IEEE float) to mono float32 and its sample rate."""
    if not is_wav(data):
        raise AudioFormatError("not a RIFF/WAVE file")
    pos, fmt, payload = 12, None, None
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        body = data[pos + 8 : pos + 8 + size]
        if cid == b"fmt ":
            if len(body) < 16:
                raise AudioFormatError("WAV fmt chunk too short")
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif cid == b"data":
            payload = body
        pos += 8 + size + (size & 1)
    if fmt is None or payload is None:
        raise AudioFormatError("WAV file lacks a fmt or data chunk")
    tag, channels, rate, _, _, bits = fmt
    if tag == 0xFFFE and len(payload) >= 0:  # WAVE_FORMAT_EXTENSIBLE: trust bits
        tag = 3 if bits == 32 and _looks_float(payload) else 1
    if channels < 1 or rate <= 0:
        raise AudioFormatError("WAV header has no channels or no sample rate")
    if tag == 3 and bits == 32:
        samples = np.frombuffer(payload[: len(payload) // 4 * 4], dtype="<f4").astype(np.float32)
    elif tag == 1 and bits == 16:
        samples = np.frombuffer(payload[: len(payload) // 2 * 2], dtype="<i2") / 32768.0
    elif tag == 1 and bits == 32:
        samples = np.frombuffer(payload[: len(payload) // 4 * 4], dtype="<i4") / 2147483648.0
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
        samples = ints / float(1 << 23)
    else:
        raise AudioFormatError(f"unsupported WAV encoding (format {tag}, {bits} bits)")
    samples = np.asarray(samples, dtype=np.float32)
    if channels > 1:
        samples = samples[: len(samples) // channels * channels].reshape(-1, channels).mean(axis=1)
    return samples.astype(np.float32), int(rate)


def _looks_float(payload: bytes) -> bool:
    probe = np.frombuffer(payload[: min(len(payload), 4096) // 4 * 4], dtype="<f4")
    return bool(probe.size) and bool(np.all(np.isfinite(probe))) and float(np.abs(probe).max()) <= 8


def encode_wav(samples: np.ndarray, rate: int) -> bytes:
    """Mono 16-bit PCM WAV bytes."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + len(pcm),
        b"WAVE",
        b"fmt ",
        16,
        1,
        1,
        rate,
        rate * 2,
        2,
        16,
        b"data",
        len(pcm),
    )
    return header + pcm


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Resample mono float32 audio (polyphase when SciPy is present, else linear)."""
    if rate_in == rate_out or samples.size == 0:
        return samples.astype(np.float32, copy=False)
    try:
        from math import gcd

        from scipy.signal import resample_poly

        g = gcd(rate_in, rate_out)
        return resample_poly(samples, rate_out // g, rate_in // g).astype(np.float32)
    except ImportError:
        n_out = int(round(samples.size * rate_out / rate_in))
        x_old = np.linspace(0.0, 1.0, samples.size, endpoint=False)
        x_new = np.linspace(0.0, 1.0, n_out, endpoint=False)
        return np.interp(x_new, x_old, samples).astype(np.float32)


def pcm_or_wav_to_16k(data: bytes) -> np.ndarray:
    """Reference audio as sent by clients: a WAV file (any rate) or raw float32 PCM at 16 kHz."""
    if is_wav(data):
        samples, rate = decode_wav(data)
        return resample(samples, rate, 16_000)
    if len(data) % 4:
        raise AudioFormatError("float32 PCM byte length is not a multiple of 4")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)
