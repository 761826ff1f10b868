"""Small pure units: audio pieces, WAV decoding, the scripted backend, validation helpers."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest

from api.errors import ProtocolError
from api.validation import MIN_INPUT_SAMPLES, check_voice, decode_pcm
from inference import (
    ChatDelta,
    ChatDone,
    ChatPrefilled,
    ChatRequest,
    DuplexConfig,
    DuplexInput,
    Message,
    TextPart,
    create_backend,
)
from omnicore.audio import pcm_or_wav_to_16k, read_audio, resample, wav_bytes
from streaming.keys import Keys, slot_worker, ticket_gateway, worker_queue
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


def test_pcm_validation() -> None:
    ok = base64.b64encode(np.zeros(MIN_INPUT_SAMPLES, np.float32).tobytes()).decode()
    assert len(decode_pcm(ok, "audio")) == 4 * MIN_INPUT_SAMPLES
    for bad in (
        "@@",
        base64.b64encode(b"\0" * 7).decode(),
        base64.b64encode(np.zeros(10, np.float32).tobytes()).decode(),
    ):
        with pytest.raises(ProtocolError) as err:
            decode_pcm(bad, "audio")
        assert err.value.code == "invalid_payload" and err.value.field == "audio"
    with pytest.raises(ProtocolError):
        check_voice(base64.b64encode(b"RIFF\0\0\0\0WAVEjunk").decode(), "voice")


def test_key_helpers() -> None:
    k = Keys("p")
    assert k.output_log("rt_1").startswith("p:s:rt_1")
    assert slot_worker("omni-1@host#42|3") == "omni-1@host#42"
    assert worker_queue("omni-1@host#42") == "omni.w.omni-1@host"
    assert ticket_gateway("ticket_abc123_7") == "abc123"


def test_scripted_backend_is_deterministic() -> None:
    b = create_backend("scripted", token_delay_s=0)
    req = ChatRequest(messages=[Message("user", [TextPart("Reply with exactly: a b")])])
    events = list(b.chat(req))
    assert isinstance(events[0], ChatPrefilled)
    assert [e.text for e in events if isinstance(e, ChatDelta)] == ["a", " b"]
    assert isinstance(events[-1], ChatDone) and events[-1].text == "a b"
    assert b.info()["label"].startswith("scripted")
    s = b.open_duplex()
    s.prepare(DuplexConfig(system_prompt="x"))
    loud, quiet = np.full(16000, 0.2, np.float32), np.zeros(16000, np.float32)
    steps = [s.step(DuplexInput(audio=a)) for a in (quiet, loud, quiet, quiet, quiet)]
    assert [st.listen for st in steps] == [True, True, False, False, True]
    assert steps[3].end_of_turn and steps[2].audio is not None and steps[2].audio.size == 24000
    kvs = [st.kv_cache_length for st in steps]
    assert kvs == sorted(kvs)
