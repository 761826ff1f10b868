"""Validation of client events (both dialects) into normalised values for the workers.

Every problem raises ProtocolError with the documented code and a message naming the field:
``missing_field`` for an absent required field, ``invalid_payload`` for a wrong type or value.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Literal

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from api.errors import ProtocolError
from omnicore.audio import AudioFormatError, b64_decode, is_wav, read_audio
from omnicore.voices import VoiceError, resolve_voice
from streaming.controls import InitControl
from streaming.events import ErrorCode

MIN_INPUT_SAMPLES = 4000
MAX_SLICE_NUMS = 9
Number = float | int


def _b64(value: str, where: str) -> bytes:
    try:
        return b64_decode(value)
    except AudioFormatError:
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD, f"{where}: base64 decode failed", where
        ) from None


def decode_pcm(value: str, where: str, min_samples: int = MIN_INPUT_SAMPLES) -> bytes:
    """Base64 float32 PCM -> raw bytes, with the protocol's length checks."""
    raw = _b64(value, where)
    if len(raw) % 4:
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD,
            f"{where}: PCM byte length {len(raw)} is not a multiple of 4",
            where,
        )
    if len(raw) // 4 < min_samples:
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD,
            f"{where}: {len(raw) // 4} samples is too short (minimum {min_samples}, 250 ms)",
            where,
        )
    return raw


def check_voice(value: str, where: str) -> str:
    """Reference audio: base64 float32 PCM or a base64 WAV file (RIFF header). Returns it."""
    raw = _b64(value, where)
    if is_wav(raw):
        try:
            read_audio(raw)
        except AudioFormatError as exc:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{where}: {exc}", where) from None
    elif len(raw) % 4:
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD,
            f"{where}: float32 PCM byte length is not a multiple of 4",
            where,
        )
    return value


def decode_jpeg(value: str, where: str) -> bytes:
    """Base64 JPEG -> bytes, checked to be a decodable JPEG."""
    raw = _b64(value, where)
    if not raw.startswith(b"\xff\xd8"):
        raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{where}: not a JPEG image", where)
    verify_image(raw, where, "JPEG")
    return raw


def verify_image(raw: bytes, where: str, required_format: str | None = None) -> None:
    """Raise invalid_payload unless Pillow can read ``raw`` (in ``required_format``, if given)."""
    what = f"{required_format} data" if required_format else "image"
    try:
        with Image.open(io.BytesIO(raw)) as img:
            if required_format and img.format != required_format:
                raise ValueError(img.format)
            img.verify()
    except Exception:  # noqa: BLE001 - any decoder complaint means invalid
        raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{where}: invalid {what}", where) from None


def _raise_from(exc: ValidationError, prefix: str) -> None:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
    if err["type"] == "missing":
        raise ProtocolError(ErrorCode.MISSING_FIELD, f"missing required field {loc}", loc) from None
    raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{loc}: {err['msg']}", loc) from None


def parse(model: type[BaseModel], value: Any, prefix: str) -> Any:
    """Validate ``value`` against a pydantic model, translating errors to protocol errors."""
    if not isinstance(value, dict):
        raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{prefix} must be an object", prefix)
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        _raise_from(exc, prefix)


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------- duplex


class Voice(_Loose):
    ref_audio_base64: StrictStr | None = None
    tts_ref_audio_base64: StrictStr | None = None


class InitPayload(_Loose):
    system_prompt: StrictStr | None = None
    instructions: StrictStr | None = None
    config: dict[str, Any] | None = None
    voice: Voice | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)


class LegacySession(_Loose):
    instructions: StrictStr
    ref_audio: StrictStr | None = None
    tts_ref_audio: StrictStr | None = None
    config: dict[str, Any] | None = None


class Hints(_Loose):
    force_listen: StrictBool | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)


class DuplexInputModel(_Loose):
    audio: StrictStr
    video_frames: list[StrictStr] | None = None
    force_listen: StrictBool | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)
    hints: Hints | None = None


class LegacyAppend(_Loose):
    audio: StrictStr
    force_listen: StrictBool | None = None
    video_frames: list[StrictStr] | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)


@dataclass(slots=True)
class DuplexInit:
    """A validated session.init / session.update."""

    system_prompt: str = ""
    ref_audio: str | None = None  # base64, PCM or WAV
    tts_ref_audio: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    max_slice_nums: int | None = None

    def control(self) -> InitControl:
        """The init control event for the worker."""
        return InitControl(
            system_prompt=self.system_prompt,
            ref_audio=self.ref_audio,
            tts_ref_audio=self.tts_ref_audio or self.ref_audio,
            config=self.config,
            max_slice_nums=self.max_slice_nums,
        )


def duplex_init(event: dict[str, Any]) -> DuplexInit:
    """Validate ``session.init {payload}`` or ``session.update {session}``."""
    if event["type"] == "session.update":
        if "session" not in event:
            raise ProtocolError(
                ErrorCode.MISSING_FIELD, "missing required field session", "session"
            )
        s = parse(LegacySession, event["session"], "session")
        ref = check_voice(s.ref_audio, "session.ref_audio") if s.ref_audio else None
        tts = check_voice(s.tts_ref_audio, "session.tts_ref_audio") if s.tts_ref_audio else None
        return DuplexInit(s.instructions, ref, tts, dict(s.config or {}))
    if "payload" not in event:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "missing required field payload", "payload")
    p = parse(InitPayload, event["payload"], "payload")
    voice = p.voice or Voice()
    ref = (
        check_voice(voice.ref_audio_base64, "payload.voice.ref_audio_base64")
        if voice.ref_audio_base64
        else None
    )
    tts = (
        check_voice(voice.tts_ref_audio_base64, "payload.voice.tts_ref_audio_base64")
        if voice.tts_ref_audio_base64
        else None
    )
    prompt = p.system_prompt if p.system_prompt is not None else (p.instructions or "")
    return DuplexInit(prompt, ref, tts, dict(p.config or {}), p.max_slice_nums)


@dataclass(slots=True)
class DuplexAppend:
    """A validated duplex input."""

    audio: bytes
    frames: list[bytes]
    force_listen: bool
    max_slice_nums: int


def duplex_append(event: dict[str, Any], default_slices: int = 1) -> DuplexAppend:
    """Validate ``input.append {input}`` or ``input_audio_buffer.append {audio}``."""
    if event["type"] == "input_audio_buffer.append":
        m = parse(LegacyAppend, event, "")
        where, hints = "audio", None
        frames_where = "video_frames"
    else:
        if "input" not in event:
            raise ProtocolError(ErrorCode.MISSING_FIELD, "missing required field input", "input")
        m = parse(DuplexInputModel, event["input"], "input")
        where, hints = "input.audio", m.hints
        frames_where = "input.video_frames"
    audio = decode_pcm(m.audio, where)
    frames = [decode_jpeg(f, f"{frames_where}[{i}]") for i, f in enumerate(m.video_frames or [])]
    force = m.force_listen if m.force_listen is not None else bool(hints and hints.force_listen)
    slices = m.max_slice_nums or (hints.max_slice_nums if hints else None) or default_slices
    return DuplexAppend(audio, frames, bool(force), int(slices))


# --------------------------------------------------------------------------- chat


class ContentItem(_Loose):
    type: Literal["text", "image", "audio", "video"]
    text: StrictStr | None = None
    data: StrictStr | None = None
    sample_rate: StrictInt | None = Field(None, gt=0, le=384_000)
    stack_frames: StrictInt | None = Field(None, ge=1, le=64)


class ChatMessage(_Loose):
    role: Literal["system", "user", "assistant"]
    content: StrictStr | list[ContentItem]


class Generation(_Loose):
    max_new_tokens: StrictInt | None = Field(None, ge=1, le=8192)
    temperature: Number | None = Field(None, ge=0, le=10)
    top_p: Number | None = Field(None, gt=0, le=1)
    length_penalty: Number | None = Field(None, gt=0, le=10)


class TTS(_Loose):
    enabled: StrictBool | None = None
    mode: (
        Literal["default", "audio_assistant", "omni", "audio_roleplay", "voice_cloning"] | None
    ) = None
    ref_audio_path: StrictStr | None = None
    ref_audio_data: StrictStr | None = None
    language: StrictStr | None = None


class ImageOpts(_Loose):
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)
    use_image_id: StrictBool | None = None


class ChatInput(_Loose):
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
            if item.type == "text":
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
            if item.type == "image":
                raw = _b64(item.data, f"{where}.data")
                verify_image(raw, f"{where}.data")
            elif item.type == "audio":
                raw = _b64(item.data, f"{where}.data")
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
                if not _b64(item.data, f"{where}.data"):
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
