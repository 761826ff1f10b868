"""Turn a validated chat request (plain JSON, media in base64) into the backend's ChatRequest."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

from inference import (
    AudioPart,
    ChatRequest,
    ContentPart,
    GenerationConfig,
    ImagePart,
    Message,
    TextPart,
    TTSConfig,
    UnsupportedInput,
    VideoPart,
)
from omnicore.audio import INPUT_RATE, b64_decode, b64_to_pcm, pcm_or_wav_to_16k, resample
from omnicore.voices import VoiceError, resolve_voice


def _audio(data: str, sample_rate: int) -> np.ndarray:
    return resample(b64_to_pcm(data), sample_rate, INPUT_RATE)


def decode_video(data: bytes, fps: float = 1.0) -> tuple[list[bytes], list[np.ndarray]]:
    """Split a video file into JPEG frames (``fps`` per second) and 1 s audio segments at 16 kHz."""
    try:
        import av
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise UnsupportedInput(
            "video content needs the 'av' package on the worker", "messages[].content[].data"
        ) from exc
    frames: list[bytes] = []
    audio: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            next_t = 0.0
            for frame in container.decode(video=0):
                t = float(frame.time or 0.0)
                if t + 1e-6 >= next_t:
                    buf = io.BytesIO()
                    image = frame.to_image()  # type: ignore[no-untyped-call]  # PyAV stub
                    image.convert("RGB").save(buf, format="JPEG", quality=90)
                    frames.append(buf.getvalue())
                    next_t += 1.0 / fps
        with av.open(io.BytesIO(data), mode="r") as container:
            if container.streams.audio:
                resampler = av.AudioResampler(format="flt", layout="mono", rate=16_000)
                for sound in container.decode(audio=0):
                    audio.extend(
                        out.to_ndarray().reshape(-1).astype(np.float32)
                        for out in resampler.resample(sound)
                    )
    except av.error.FFmpegError as exc:
        raise UnsupportedInput(
            f"video could not be decoded: {exc}", "messages[].content[].data"
        ) from exc
    pcm = np.concatenate(audio) if audio else np.zeros(0, dtype=np.float32)
    segments = [pcm[i : i + 16_000] for i in range(0, pcm.size, 16_000)]
    return frames, segments


def _part(item: Any) -> ContentPart:
    kind = item["type"]
    if kind == "text":
        return TextPart(text=item["text"])
    if kind == "image":
        return ImagePart(data=base64.b64decode(item["data"]))
    if kind == "audio":
        return AudioPart(samples=_audio(item["data"], int(item.get("sample_rate") or 16_000)))
    if kind == "video":
        stack_frames = int(item.get("stack_frames") or 1)  # frames per second of video
        frames, segments = decode_video(base64.b64decode(item["data"]), fps=stack_frames)
        return VideoPart(frames=frames, audio_segments=segments, stack_frames=stack_frames)
    raise UnsupportedInput(f"unknown content type {kind!r}", "messages[].content[].type")


def voice_path(name: str | None, voices_dir: str | None) -> str | None:
    """The real path of a client-named voice inside the voices directory (resolved here, where
    the backend will read it, with the same rules the gateway checked: ``omnicore.voices``)."""
    if name is None:
        return None
    try:
        return str(resolve_voice(voices_dir, name))
    except VoiceError as exc:
        raise UnsupportedInput(f"tts.ref_audio_path: {exc}", "tts.ref_audio_path") from None


def build_chat_request(req: dict[str, Any], voices_dir: str | None = None) -> ChatRequest:
    """The backend request for one validated turn (``voices_dir``: OMNISERVE_VOICES_DIR)."""
    messages = []
    for m in req["messages"]:
        content = m["content"]
        parts: list[ContentPart] = (
            [TextPart(text=content)] if isinstance(content, str) else [_part(c) for c in content]
        )
        messages.append(Message(role=m["role"], content=parts))
    gen = req.get("generation") or {}
    tts = req.get("tts") or {}
    image = req.get("image") or {}
    ref = tts.get("ref_audio_data")
    return ChatRequest(
        messages=messages,
        streaming=bool(req.get("streaming", True)),
        generation=GenerationConfig(**{k: v for k, v in gen.items() if v is not None}),
        tts=TTSConfig(
            enabled=bool(tts.get("enabled", False)),
            mode=tts.get("mode") or "default",
            ref_audio=pcm_or_wav_to_16k(b64_decode(ref)) if ref else None,
            ref_audio_path=voice_path(tts.get("ref_audio_path"), voices_dir),
            language=tts.get("language"),
        ),
        max_slice_nums=image.get("max_slice_nums"),
        use_image_id=bool(image.get("use_image_id", True)),
        omni_mode=bool(req.get("omni_mode", False)),
        use_tts_template=bool(req.get("use_tts_template", False)),
        enable_thinking=bool(req.get("enable_thinking", False)),
    )
