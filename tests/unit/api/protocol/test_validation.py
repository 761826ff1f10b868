"""api/protocol/validation.py: client events -> normalised values, or the documented error and
field."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from api.protocol.chat_validation import LEGACY_CHAT_DEFAULTS, REALTIME_CHAT_DEFAULTS, chat_request
from api.protocol.errors import ProtocolError
from api.protocol.validation import (
    OLDER_MIN_INPUT_SAMPLES,
    check_voice,
    decode_pcm,
    duplex_append,
    duplex_init,
)
from omnicore.audio import wav_bytes
from streaming.controls import InitControl
from streaming.events import ErrorCode


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def pcm(samples: int = 16000) -> str:
    return b64(np.zeros(samples, np.float32).tobytes())


def jpeg() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="JPEG")
    return b64(buf.getvalue())


def refused(call: Any, *args: Any) -> tuple[ErrorCode, str | None]:
    with pytest.raises(ProtocolError) as err:
        call(*args)
    return err.value.code, err.value.field


def test_pcm_and_voice_checks() -> None:
    older = OLDER_MIN_INPUT_SAMPLES
    assert len(decode_pcm(pcm(older), "audio", older)) == 4 * older
    assert len(decode_pcm(pcm(1), "audio")) == 4  # the current dialect: any length
    for bad, minimum in (("@@", 1), (b64(b"\0" * 7), 1), (pcm(0), 1), (pcm(older - 1), older)):
        assert refused(decode_pcm, bad, "audio", minimum) == (ErrorCode.INVALID_PAYLOAD, "audio")
    wav = b64(wav_bytes(np.zeros(800, np.float32), 8000))
    assert check_voice(wav, "v") == wav and check_voice(pcm(100), "v")
    assert refused(check_voice, b64(b"RIFF\0\0\0\0WAVEjunk"), "v") == (
        ErrorCode.INVALID_PAYLOAD,
        "v",
    )


def test_duplex_init_both_dialects() -> None:
    init = duplex_init(
        {
            "type": "session.init",
            "payload": {"instructions": "b", "voice": {"ref_audio_base64": pcm(100)}},
        }
    )
    assert init.control() == InitControl(
        system_prompt="b", ref_audio=pcm(100), tts_ref_audio=pcm(100)
    )
    init = duplex_init(
        {"type": "session.init", "payload": {"system_prompt": "a", "instructions": "b"}}
    )
    assert init.system_prompt == "a"  # system_prompt wins
    older = duplex_init(
        {"type": "session.update", "session": {"instructions": "x", "config": {"k": 1}}}
    )
    assert older.control() == InitControl(system_prompt="x", config={"k": 1})


def test_duplex_init_opts_in_to_the_expiring_notice() -> None:
    init = duplex_init(
        {"type": "session.init", "payload": {"extensions": ["session.expiring", "later.thing"]}}
    )
    assert init.control().expiring is True  # a name it does not know is ignored
    assert duplex_init({"type": "session.init", "payload": {}}).control().expiring is False
    older = duplex_init(
        {
            "type": "session.update",
            "session": {"instructions": "x", "extensions": ["session.expiring"]},
        }
    )
    assert older.control().expiring is True
    with pytest.raises(ProtocolError) as err:
        duplex_init({"type": "session.init", "payload": {"extensions": "session.expiring"}})
    assert err.value.field == "payload.extensions"


@pytest.mark.parametrize(
    "event,code,field",
    [
        ({"type": "session.init"}, ErrorCode.MISSING_FIELD, "payload"),
        ({"type": "session.init", "payload": 3}, ErrorCode.INVALID_PAYLOAD, "payload"),
        (
            {"type": "session.init", "payload": {"max_slice_nums": 10}},
            ErrorCode.INVALID_PAYLOAD,
            "payload.max_slice_nums",
        ),
        (
            {"type": "session.update", "session": {}},
            ErrorCode.MISSING_FIELD,
            "session.instructions",
        ),
    ],
)
def test_duplex_init_errors(event: dict[str, Any], code: ErrorCode, field: str) -> None:
    assert refused(duplex_init, event) == (code, field)


def test_duplex_append_hints_and_defaults() -> None:
    got = duplex_append(
        {
            "type": "input.append",
            "input": {"audio": pcm(), "video_frames": [jpeg()], "hints": {"force_listen": True}},
        },
        default_slices=4,
    )
    assert got.force_listen and got.max_slice_nums == 4 and len(got.frames) == 1
    got = duplex_append(
        {
            "type": "input.append",
            "input": {
                "audio": pcm(),
                "max_slice_nums": 2,
                "force_listen": False,
                "hints": {"force_listen": True, "max_slice_nums": 5},
            },
        }
    )
    assert (got.force_listen, got.max_slice_nums) == (False, 2)  # top level wins
    older = duplex_append({"type": "input_audio_buffer.append", "audio": pcm()})
    assert len(older.audio) == 64000 and older.frames == []


@pytest.mark.parametrize(
    "event,field",
    [
        (
            {"type": "input.append", "input": {"audio": pcm(), "video_frames": [pcm()]}},
            "input.video_frames[0]",
        ),
        ({"type": "input.append", "input": {"audio": pcm(0)}}, "input.audio"),
        ({"type": "input_audio_buffer.append", "audio": pcm(3999)}, "audio"),
        ({"type": "input_audio_buffer.append", "audio": 5}, "audio"),
        (
            {"type": "input_audio_buffer.append", "audio": pcm(), "video_frames": [7]},
            "video_frames[0]",
        ),
    ],
)
def test_duplex_append_errors(event: dict[str, Any], field: str) -> None:
    assert refused(duplex_append, event) == (ErrorCode.INVALID_PAYLOAD, field)


@pytest.mark.parametrize("samples", [1, 37, 1600, 3999, 4000, 16000, 40000])
def test_current_dialect_takes_any_chunk_length(samples: int) -> None:
    got = duplex_append({"type": "input.append", "input": {"audio": pcm(samples)}})
    assert len(got.audio) == 4 * samples


def test_chat_defaults_differ_by_endpoint() -> None:
    turn = {"messages": [{"role": "user", "content": "hi"}]}
    realtime = chat_request(turn, REALTIME_CHAT_DEFAULTS)
    legacy = chat_request(turn, LEGACY_CHAT_DEFAULTS, prefix="request")
    assert realtime["generation"]["max_new_tokens"] == 256 and not realtime["tts"]["enabled"]
    assert legacy["generation"]["max_new_tokens"] == 512 and legacy["tts"]["enabled"]
    assert realtime["streaming"] is True and realtime["image"]["use_image_id"] is True


@pytest.mark.parametrize(
    "turn,code,field",
    [
        ({"messages": []}, ErrorCode.INVALID_PAYLOAD, "input.messages"),
        ({}, ErrorCode.MISSING_FIELD, "input.messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            ErrorCode.MISSING_FIELD,
            "input.messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "audio", "data": b64(b"")}]}]},
            ErrorCode.INVALID_PAYLOAD,
            "input.messages[0].content[0].data",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "generation": {"top_p": 0}},
            ErrorCode.INVALID_PAYLOAD,
            "input.generation.top_p",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "tts": {"ref_audio_data": "@@"}},
            ErrorCode.INVALID_PAYLOAD,
            "input.tts.ref_audio_data",
        ),
        # pydantic's findings use the same paths: brackets for indexes, no union member labels
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "x"}]},
            ErrorCode.INVALID_PAYLOAD,
            "input.messages[1].role",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {}]}]},
            ErrorCode.MISSING_FIELD,
            "input.messages[0].content[1].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "gif", "data": "AAAA"}]}]},
            ErrorCode.INVALID_PAYLOAD,
            "input.messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": 7}]},
            ErrorCode.INVALID_PAYLOAD,
            "input.messages[0].content",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "generation": {"top_p": "0.5"}},
            ErrorCode.INVALID_PAYLOAD,
            "input.generation.top_p",
        ),
    ],
)
def test_chat_errors_name_the_field(turn: dict[str, Any], code: ErrorCode, field: str) -> None:
    assert refused(chat_request, turn, REALTIME_CHAT_DEFAULTS) == (code, field)
