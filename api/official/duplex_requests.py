"""The client frames of the official gateway's ``/ws/duplex``, validated for the worker.

``prepare {system_prompt, config, ref_audio_base64, tts_ref_audio_base64, ref_audio_path,
max_slice_nums, deferred_finalize}`` becomes the session's ``InitControl`` (with
``whole_steps``: one ``result`` per step); ``audio_chunk {audio_base64, frame_base64_list,
force_listen, max_slice_nums}`` an input chunk. Audio is base64 float32 PCM at 16 kHz (reference
audio may be a WAV file too); frames are base64 JPEG. ``ref_audio_path`` is a voice name in the
voices directory (``omnicore/voices.py``), never a server path. A problem raises
``ProtocolError``; its message is what the client is told.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr

from api.official.assets import AssetError, find_voice
from api.protocol.errors import ProtocolError
from api.protocol.validation import (
    MAX_SLICE_NUMS,
    LooseModel,
    check_voice,
    decode_jpeg,
    decode_pcm,
    parse,
)
from omnicore.audio import INPUT_RATE, AudioFormatError, load_voice
from streaming.controls import InitControl
from streaming.events import ErrorCode

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."  # the official worker's default


class Prepare(LooseModel):
    system_prompt: StrictStr | None = None
    config: dict[str, Any] | None = None
    ref_audio_base64: StrictStr | None = None
    tts_ref_audio_base64: StrictStr | None = None
    ref_audio_path: StrictStr | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)
    deferred_finalize: StrictBool | None = None  # the worker's own scheduling: accepted, ignored


class AudioChunkFrame(LooseModel):
    audio_base64: StrictStr
    frame_base64_list: list[StrictStr] | None = None
    force_listen: StrictBool | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)


def _voice_file(voices_dir: str | None, name: str) -> str:
    """A voice of the voices directory as base64 float32 PCM at 16 kHz (what the worker takes)."""
    try:
        samples = load_voice(find_voice(voices_dir, name), INPUT_RATE)
    except AssetError as exc:
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD, f"ref_audio_path: {exc.detail}", "ref_audio_path"
        ) from None
    except (AudioFormatError, OSError, RuntimeError):
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD,
            f"ref_audio_path: voice {name!r} is not a readable audio file",
            "ref_audio_path",
        ) from None
    return base64.b64encode(samples.astype("<f4").tobytes()).decode("ascii")


def prepare_control(event: dict[str, Any], voices_dir: str | None) -> InitControl:
    """``prepare`` -> the session's init control (reads a named voice file: call it off the
    event loop)."""
    p: Prepare = parse(Prepare, event, "")
    config = dict(p.config or {})
    slices = p.max_slice_nums or config.pop("max_slice_nums", None)
    if slices is not None and (not isinstance(slices, int) or not 1 <= slices <= MAX_SLICE_NUMS):
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD,
            f"config.max_slice_nums must be an integer from 1 to {MAX_SLICE_NUMS}",
            "config.max_slice_nums",
        )
    ref = check_voice(p.ref_audio_base64, "ref_audio_base64") if p.ref_audio_base64 else None
    if p.ref_audio_path is not None and ref is None:
        ref = _voice_file(voices_dir, p.ref_audio_path)
    tts = (
        check_voice(p.tts_ref_audio_base64, "tts_ref_audio_base64")
        if p.tts_ref_audio_base64
        else None
    )
    return InitControl(
        system_prompt=DEFAULT_SYSTEM_PROMPT if p.system_prompt is None else p.system_prompt,
        ref_audio=ref,
        tts_ref_audio=tts or ref,
        config=config,
        max_slice_nums=slices,
        whole_steps=True,
    )


@dataclass(frozen=True, slots=True)
class ChunkInput:
    """A validated ``audio_chunk``."""

    audio: bytes  # float32 PCM, 16 kHz
    frames: list[bytes]
    force_listen: bool
    max_slice_nums: int


def audio_chunk(event: dict[str, Any], default_slices: int) -> ChunkInput:
    """``audio_chunk`` -> the chunk for the worker."""
    if not isinstance(event.get("audio_base64"), str) or not event["audio_base64"]:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "Missing audio_base64", "audio_base64")
    m: AudioChunkFrame = parse(AudioChunkFrame, event, "")
    audio = decode_pcm(m.audio_base64, "audio_base64")
    frames = [
        decode_jpeg(f, f"frame_base64_list[{i}]") for i, f in enumerate(m.frame_base64_list or [])
    ]
    return ChunkInput(audio, frames, bool(m.force_listen), m.max_slice_nums or default_slices)
