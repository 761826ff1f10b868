"""Validation of client events (both dialects) into normalised values for the workers.

Every problem raises ProtocolError with the documented code and a message naming the field:
``missing_field`` for an absent required field, ``invalid_payload`` for a wrong type or value.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from api.protocol.errors import ProtocolError
from api.protocol.events import ClientEvent, ServerEvent
from omnicore.audio import AudioFormatError, b64_decode, is_wav, read_audio
from streaming.controls import InitControl
from streaming.events import ErrorCode

OLDER_MIN_INPUT_SAMPLES = 4000  # spec/04, input_audio_buffer.append only: "Minimum: 4000 samples"
MAX_SLICE_NUMS = 9
Number = StrictFloat  # strict: an int is a number, a string is not


def b64_field(value: str, where: str) -> bytes:
    try:
        return b64_decode(value)
    except AudioFormatError:
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD, f"{where}: base64 decode failed", where
        ) from None


def decode_pcm(value: str, where: str, min_samples: int = 1) -> bytes:
    """Base64 float32 PCM -> raw bytes, with the protocol's length checks.

    The current dialect takes chunks of any length (at least one sample: the worker builds the
    model's units from them); the older one keeps spec/04's minimum of 4000 samples (250 ms).
    """
    raw = b64_field(value, where)
    if len(raw) % 4:
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD,
            f"{where}: PCM byte length {len(raw)} is not a multiple of 4",
            where,
        )
    if len(raw) // 4 < min_samples:
        if min_samples == 1:
            raise ProtocolError(ErrorCode.INVALID_PAYLOAD, f"{where}: empty audio", where)
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD,
            f"{where}: {len(raw) // 4} samples is too short"
            f" (minimum {min_samples}, {min_samples * 1000 // 16000} ms)",
            where,
        )
    return raw


def check_voice(value: str, where: str) -> str:
    """Reference audio: base64 float32 PCM or a base64 WAV file (RIFF header). Returns it."""
    raw = b64_field(value, where)
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
    raw = b64_field(value, where)
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


def _is_branch(part: int | str) -> bool:
    """A union member's label pydantic puts in an error's location (``str``,
    ``list[ContentItem]``, ...): no field of these models is named like one."""
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool"})


def field_path(prefix: str, loc: Sequence[int | str]) -> str:
    """The path an error names, whether pydantic or a later check found it: ``input`` and
    ``("messages", 0, "content", 1, "data")`` give ``input.messages[0].content[1].data``."""
    path = prefix
    for part in loc:
        if _is_branch(part):
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else part
    return path


def _raise_from(exc: ValidationError, prefix: str) -> None:
    errors = exc.errors()
    err = errors[0]
    # a value no member of a union accepts fails once per member: the error of the member that
    # got furthest into the value says what is wrong (a list item's bad type, not "not a str")
    first_branch = next((i for i, p in enumerate(err["loc"]) if _is_branch(p)), None)
    if first_branch is not None:
        head = err["loc"][:first_branch]
        related = [e for e in errors if e["loc"][:first_branch] == head]
        err = max(related, key=lambda e: len(e["loc"]))
    loc = field_path(prefix, err["loc"])
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


class LooseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------- duplex


class Voice(LooseModel):
    ref_audio_base64: StrictStr | None = None
    tts_ref_audio_base64: StrictStr | None = None


class InitPayload(LooseModel):
    system_prompt: StrictStr | None = None
    instructions: StrictStr | None = None
    config: dict[str, Any] | None = None
    voice: Voice | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)
    extensions: list[StrictStr] | None = None


class LegacySession(LooseModel):
    instructions: StrictStr
    ref_audio: StrictStr | None = None
    tts_ref_audio: StrictStr | None = None
    config: dict[str, Any] | None = None
    # the official gateway's names: voice_config is the backend config, max_slice_nums the
    # session's default for its inputs (its pages send both)
    voice_config: dict[str, Any] | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)
    extensions: list[StrictStr] | None = None


class Hints(LooseModel):
    force_listen: StrictBool | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)


class DuplexInputModel(LooseModel):
    audio: StrictStr
    video_frames: list[StrictStr] | None = None
    force_listen: StrictBool | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)
    hints: Hints | None = None


class LegacyAppend(LooseModel):
    audio: StrictStr
    force_listen: StrictBool | None = None
    video_frames: list[StrictStr] | None = None
    max_slice_nums: StrictInt | None = Field(None, ge=1, le=MAX_SLICE_NUMS)


EXPIRING_EXTENSION = ServerEvent.SESSION_EXPIRING
"""The opt-in extension event a duplex init may name in ``extensions``."""


@dataclass(slots=True)
class DuplexInit:
    """A validated session.init / session.update."""

    system_prompt: str = ""
    ref_audio: str | None = None  # base64, PCM or WAV
    tts_ref_audio: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    max_slice_nums: int | None = None
    # the extension events the client opted in to (names it does not know are ignored)
    extensions: frozenset[str] = frozenset()

    def control(self) -> InitControl:
        """The init control event for the worker."""
        return InitControl(
            system_prompt=self.system_prompt,
            ref_audio=self.ref_audio,
            tts_ref_audio=self.tts_ref_audio or self.ref_audio,
            config=self.config,
            max_slice_nums=self.max_slice_nums,
            expiring=EXPIRING_EXTENSION in self.extensions,
        )


def duplex_init(event: dict[str, Any]) -> DuplexInit:
    """Validate ``session.init {payload}`` or ``session.update {session}``."""
    if event["type"] == ClientEvent.SESSION_UPDATE:
        if "session" not in event:
            raise ProtocolError(
                ErrorCode.MISSING_FIELD, "missing required field session", "session"
            )
        s = parse(LegacySession, event["session"], "session")
        ref = check_voice(s.ref_audio, "session.ref_audio") if s.ref_audio else None
        tts = check_voice(s.tts_ref_audio, "session.tts_ref_audio") if s.tts_ref_audio else None
        config = {**(s.config or {}), **(s.voice_config or {})}  # voice_config wins
        extensions = frozenset(s.extensions or ())
        return DuplexInit(s.instructions, ref, tts, config, s.max_slice_nums, extensions)
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
    extensions = frozenset(p.extensions or ())
    return DuplexInit(prompt, ref, tts, dict(p.config or {}), p.max_slice_nums, extensions)


@dataclass(slots=True)
class DuplexAppend:
    """A validated duplex input."""

    audio: bytes
    frames: list[bytes]
    force_listen: bool
    max_slice_nums: int


def duplex_append(event: dict[str, Any], default_slices: int = 1) -> DuplexAppend:
    """Validate ``input.append {input}`` or ``input_audio_buffer.append {audio}``.

    Only the older event keeps spec/04's 4000-sample minimum; ``input.append`` takes any length.
    """
    if event["type"] == ClientEvent.INPUT_AUDIO_BUFFER_APPEND:
        m = parse(LegacyAppend, event, "")
        where, hints, min_samples = "audio", None, OLDER_MIN_INPUT_SAMPLES
        frames_where = "video_frames"
    else:
        if "input" not in event:
            raise ProtocolError(ErrorCode.MISSING_FIELD, "missing required field input", "input")
        m = parse(DuplexInputModel, event["input"], "input")
        where, hints, min_samples = "input.audio", m.hints, 1
        frames_where = "input.video_frames"
    audio = decode_pcm(m.audio, where, min_samples)
    frames = [decode_jpeg(f, f"{frames_where}[{i}]") for i, f in enumerate(m.video_frames or [])]
    force = m.force_listen if m.force_listen is not None else bool(hints and hints.force_listen)
    slices = m.max_slice_nums or (hints.max_slice_nums if hints else None) or default_slices
    return DuplexAppend(audio, frames, bool(force), int(slices))
