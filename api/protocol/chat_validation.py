"""Validation of chat requests (``input.append`` in chat mode, and ``/ws/chat``) into the
normalised request a chat task reads; the shared field checks live in
``api/protocol/validation.py``.

Every problem raises ProtocolError with the documented code and a message naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from api.protocol.errors import ProtocolError
from api.protocol.events import ContentType
from api.protocol.validation import (
    MAX_SLICE_NUMS,
    LooseModel,
    Number,
    b64_field,
    check_voice,
    parse,
    verify_image,
)
from omnicore.voices import VoiceError, resolve_voice
from streaming.events import ErrorCode


class ContentItem(LooseModel):
    type: ContentType
    text: StrictStr | None = None
    data: StrictStr | None = None
    sample_rate: StrictInt | None = Field(None, gt=0, le=384_000)
    stack_frames: StrictInt | None = Field(None, ge=1, le=64)


class ChatMessage(LooseModel):
    role: Literal["system", "user", "assistant"]
    content: StrictStr | list[ContentItem]


class Generation(LooseModel):
    max_new_tokens: StrictInt | None = Field(None, ge=1, le=8192)
    temperature: Number | None = Field(None, ge=0, le=10)
    top_p: Number | None = Field(None, gt=0, le=1)
    length_penalty: Number | None = Field(None, gt=0, le=10)


class TTS(LooseModel):
    enabled: StrictBool | None = None
    mode: (
        Literal["default", "audio_assistant", "omni", "audio_roleplay", "voice_cloning"] | None
    ) = None
    ref_audio_path: StrictStr | None = None
    ref_audio_data: StrictStr | None = None
    language: StrictStr | None = None


class ImageOpts(LooseModel):
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)
    use_image_id: StrictBool | None = None


class ChatInput(LooseModel):
    messages: list[ChatMessage] = Field(min_length=1)
    streaming: StrictBool | None = None
    generation: Generation | None = None
    tts: TTS | None = None
    image: ImageOpts | None = None
    omni_mode: StrictBool | None = None
    use_tts_template: StrictBool | None = None
    enable_thinking: StrictBool | None = None


@dataclass(frozen=True, slots=True)
class ChatDefaults:
    """Defaults differ between the Realtime chat mode and the legacy /ws/chat endpoint."""

    max_new_tokens: int
    length_penalty: float
    tts_enabled: bool
    temperature: float = 0.7
    top_p: float = 0.8


REALTIME_CHAT_DEFAULTS = ChatDefaults(max_new_tokens=256, length_penalty=1.1, tts_enabled=False)
LEGACY_CHAT_DEFAULTS = ChatDefaults(max_new_tokens=512, length_penalty=1.0, tts_enabled=True)


def _check_content(messages: list[ChatMessage], prefix: str) -> None:
    for i, msg in enumerate(messages):
        if isinstance(msg.content, str):
            continue
        for j, item in enumerate(msg.content):
            where = f"{prefix}.messages[{i}].content[{j}]"
            if item.type == ContentType.TEXT:
                if item.text is None:
                    raise ProtocolError(
                        ErrorCode.MISSING_FIELD,
                        f"missing required field {where}.text",
                        f"{where}.text",
                    )
                continue
            if item.data is None:
                raise ProtocolError(
                    ErrorCode.MISSING_FIELD, f"missing required field {where}.data", f"{where}.data"
                )
            if item.type == ContentType.IMAGE:
                raw = b64_field(item.data, f"{where}.data")
                verify_image(raw, f"{where}.data")
            elif item.type == ContentType.AUDIO:
                raw = b64_field(item.data, f"{where}.data")
                if len(raw) % 4:
                    raise ProtocolError(
                        ErrorCode.INVALID_PAYLOAD,
                        f"{where}.data: PCM byte length is not a multiple of 4",
                        f"{where}.data",
                    )
                if not raw:
                    raise ProtocolError(
                        ErrorCode.INVALID_PAYLOAD, f"{where}.data: empty audio", f"{where}.data"
                    )
            else:
                if not b64_field(item.data, f"{where}.data"):
                    raise ProtocolError(
                        ErrorCode.INVALID_PAYLOAD, f"{where}.data: empty video", f"{where}.data"
                    )


def check_voice_path(name: str, voices_dir: str | None, where: str) -> str:
    """A server-side voice name: refused unless it names a file inside the voices directory
    (``omnicore.voices``; the worker resolves it again where it reads the file)."""
    try:
        resolve_voice(voices_dir, name)
    except VoiceError as exc:
        raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{where}: {exc}", where) from None
    return name


def chat_request(
    value: Any, defaults: ChatDefaults, prefix: str = "input", voices_dir: str | None = None
) -> dict[str, Any]:
    """Validate one chat turn and return the normalised request the worker runs.

    ``voices_dir`` is ``OMNISERVE_VOICES_DIR``: without it ``tts.ref_audio_path`` is refused.
    """
    m: ChatInput = parse(ChatInput, value, prefix)
    _check_content(m.messages, prefix)
    gen = m.generation or Generation()
    tts = m.tts or TTS()
    img = m.image or ImageOpts()
    if tts.ref_audio_data:
        check_voice(tts.ref_audio_data, f"{prefix}.tts.ref_audio_data")
    if tts.ref_audio_path is not None:
        check_voice_path(tts.ref_audio_path, voices_dir, f"{prefix}.tts.ref_audio_path")
    return {
        "messages": [
            {
                "role": msg.role,
                "content": msg.content
                if isinstance(msg.content, str)
                else [item.model_dump(exclude_none=True) for item in msg.content],
            }
            for msg in m.messages
        ],
        "streaming": True if m.streaming is None else m.streaming,
        "generation": {
            "max_new_tokens": gen.max_new_tokens or defaults.max_new_tokens,
            "temperature": defaults.temperature if gen.temperature is None else gen.temperature,
            "top_p": defaults.top_p if gen.top_p is None else gen.top_p,
            "length_penalty": (
                defaults.length_penalty if gen.length_penalty is None else gen.length_penalty
            ),
        },
        "tts": {
            "enabled": defaults.tts_enabled if tts.enabled is None else tts.enabled,
            "mode": tts.mode or "default",
            "ref_audio_path": tts.ref_audio_path,
            "ref_audio_data": tts.ref_audio_data,
            "language": tts.language,
        },
        "image": {
            "max_slice_nums": img.max_slice_nums,
            "use_image_id": True if img.use_image_id is None else img.use_image_id,
        },
        "omni_mode": bool(m.omni_mode),
        "use_tts_template": bool(m.use_tts_template),
        "enable_thinking": bool(m.enable_thinking),
    }
