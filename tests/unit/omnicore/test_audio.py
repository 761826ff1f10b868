"""omnicore/audio.py: WAV of several encodings, mixing down, resampling, the wire form."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from omnicore.audio import (
    AudioFormatError,
    b64_to_pcm,
    pcm_or_wav_to_16k,
    pcm_to_b64,
    read_audio,
    resample,
    wav_bytes,
)


def _wav(samples: np.ndarray, rate: int, fmt: int, bits: int, channels: int = 1) -> bytes:
    if fmt == 3:
        payload = samples.astype("<f4").tobytes()
    elif bits == 16:
        payload = (samples * 32767).astype("<i2").tobytes()
    else:
        payload = (samples * 2147483647).astype("<i4").tobytes()
    block = channels * bits // 8
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + len(payload),
        b"WAVE",
        b"fmt ",
        16,
        fmt,
        channels,
        rate,
        rate * block,
        block,
        bits,
        b"data",
        len(payload),
    )
    return header + payload


@pytest.mark.parametrize("fmt,bits", [(1, 16), (1, 32), (3, 32)])
def test_wav_formats(fmt: int, bits: int) -> None:
    x = (0.5 * np.sin(np.linspace(0, 20, 800))).astype(np.float32)
    samples, rate = read_audio(_wav(x, 8000, fmt, bits))
    assert rate == 8000 and samples.size == 800
    assert np.allclose(samples, x, atol=1e-3)


def test_stereo_wav_is_mixed_down_and_resampled() -> None:
    x = np.ones(1600, np.float32) * 0.25  # 800 frames of 2 channels
    out = pcm_or_wav_to_16k(_wav(x, 8000, 3, 32, channels=2))
    assert out.size == 1600 and np.allclose(out[100:-100], 0.25, atol=0.02)


def test_encode_decode_round_trip_and_resample() -> None:
    x = np.linspace(-0.9, 0.9, 2400).astype(np.float32)
    y, rate = read_audio(wav_bytes(x, 24000))
    assert rate == 24000 and np.allclose(x, y, atol=1e-4)
    assert resample(x, 24000, 16000).size == 1600


def test_wire_form_round_trip_and_errors() -> None:
    x = np.linspace(-1, 1, 100).astype(np.float32)
    assert np.array_equal(b64_to_pcm(pcm_to_b64(x)), x)
    assert pcm_to_b64(None) == ""
    with pytest.raises(AudioFormatError):
        b64_to_pcm("@@")
    with pytest.raises(AudioFormatError):
        read_audio(b"RIFF\0\0\0\0WAVEjunk")
