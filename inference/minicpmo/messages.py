"""Chat messages in the model's format: content lists of text, PIL images and 16 kHz audio.

Video parts are laid out per second as the model's own video utility does
(``minicpmo.utils.get_video_frame_audio_segments``): the second's frame, its audio, then - with
``stack_frames`` > 1 - one image combining the second's remaining frames in a grid.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from inference.base import (
    AudioPart,
    BackendError,
    ChatRequest,
    ImagePart,
    Message,
    TextPart,
    UnsupportedInput,
    VideoPart,
)
from omnicore.audio import to_mono_float32

STACK_SEPARATOR_PX = 6  # black lines between the cells of a stacked frame


def decode_image(data: bytes) -> Any:
    """An encoded image as an RGB PIL image (bad data is the client's error)."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - pillow is a base dependency
        raise BackendError("Pillow is required for image input") from exc
    try:
        return Image.open(io.BytesIO(data)).convert("RGB")
    except Exception as exc:
        raise UnsupportedInput(f"cannot decode image: {exc}", "image") from exc


def as_float_audio(samples: np.ndarray, field_name: str) -> np.ndarray:
    """Mono float32 audio; non-finite samples are refused."""
    audio = to_mono_float32(samples)
    if not np.all(np.isfinite(audio)):
        raise UnsupportedInput("audio contains non-finite samples", field_name)
    return audio


def _grid(images: list[Any]) -> tuple[int, int]:
    """(rows, cols): 2x2 for four, the squarer of 1xN / Nx1 for two or three, else one row."""
    n = len(images)
    if n == 4:
        return 2, 2
    if n in (2, 3):
        cell_w = max(im.width for im in images)
        cell_h = max(im.height for im in images)
        wide = abs((n * cell_w) / cell_h - 1.0)
        tall = abs(cell_w / (n * cell_h) - 1.0)
        return (1, n) if wide <= tall else (n, 1)
    return 1, n


def stack_images(images: list[Any]) -> Any:
    """Several frames as one image: equal cells (letterboxed), separated by black lines."""
    from PIL import Image

    rows, cols = _grid(images)
    cell_w = max(im.width for im in images)
    cell_h = max(im.height for im in images)
    sep = STACK_SEPARATOR_PX
    canvas = Image.new("RGB", (cols * cell_w + (cols - 1) * sep, rows * cell_h + (rows - 1) * sep))
    for i, im in enumerate(images[: rows * cols]):
        scale = min(cell_w / im.width, cell_h / im.height)
        w, h = max(1, round(im.width * scale)), max(1, round(im.height * scale))
        cell = Image.new("RGB", (cell_w, cell_h), (255, 255, 255))
        cell.paste(im.resize((w, h)), ((cell_w - w) // 2, (cell_h - h) // 2))
        r, c = divmod(i, cols)
        canvas.paste(cell, (c * (cell_w + sep), r * (cell_h + sep)))
    return canvas


def video_contents(part: VideoPart, index: int) -> list[Any]:
    """A video part as the model's per-second items: frame, audio, [stacked frame]."""
    where = f"messages[{index}].content"
    segments = [as_float_audio(s, where) for s in part.audio_segments]
    frames = [decode_image(f) for f in part.frames]
    if not frames and not segments:
        raise UnsupportedInput("empty video", where)
    per_second = max(1, int(part.stack_frames or 1))
    seconds = max(len(segments), -(-len(frames) // per_second))
    out: list[Any] = []
    for sec in range(seconds):
        group = frames[sec * per_second : (sec + 1) * per_second]
        if group:
            out.append(group[0])
        if sec < len(segments) and segments[sec].size:
            out.append(segments[sec])
        if len(group) > 1:
            out.append(stack_images(group[1:]))
    return out


def convert_messages(
    request: ChatRequest, voice: np.ndarray | None, tts_on: bool, sys_prompt_fn: Any
) -> tuple[list[dict[str, Any]], bool]:
    """The request's messages in the model's format; returns (msgs, has_video).

    With speech output in a ``tts.mode`` other than ``default`` and no system message of the
    client's, the model's own voice-clone system prompt (``get_sys_prompt``) comes first.
    """
    if not request.messages:
        raise UnsupportedInput("messages must not be empty", "messages")
    msgs: list[dict[str, Any]] = []
    has_system = any(m.role == "system" for m in request.messages)
    if tts_on and request.tts.mode != "default" and not has_system and sys_prompt_fn is not None:
        sys_msg = sys_prompt_fn(voice, request.tts.mode)
        if isinstance(sys_msg, dict):
            msgs.append(sys_msg)
    has_video = False
    for i, message in enumerate(request.messages):
        content, video = _content(message, i)
        has_video = has_video or video
        msgs.append({"role": message.role, "content": content})
    if msgs[0]["role"] not in ("system", "user"):
        raise UnsupportedInput("the first message must be system or user", "messages[0].role")
    if not any(m["role"] == "user" for m in msgs):
        raise UnsupportedInput("messages need at least one user message", "messages")
    return msgs, has_video


def _content(message: Message, i: int) -> tuple[list[Any], bool]:
    if message.role not in ("system", "user", "assistant"):
        raise UnsupportedInput(f"unknown role {message.role!r}", f"messages[{i}].role")
    content: list[Any] = []
    has_video = False
    for part in message.content:
        if isinstance(part, TextPart):
            content.append(part.text)
        elif isinstance(part, ImagePart):
            content.append(decode_image(part.data))
        elif isinstance(part, AudioPart):
            audio = as_float_audio(part.samples, f"messages[{i}].content")
            if audio.size == 0:
                raise UnsupportedInput("empty audio", f"messages[{i}].content")
            content.append(audio)
        elif isinstance(part, VideoPart):
            has_video = True
            content.extend(video_contents(part, i))
        else:
            raise UnsupportedInput(
                f"unsupported content part {type(part).__name__}", f"messages[{i}].content"
            )
    if not content:
        raise UnsupportedInput("message has no content", f"messages[{i}].content")
    return content, has_video


def streaming_segments(
    msgs: list[dict[str, Any]], first: int, later: int
) -> tuple[list[dict[str, Any]], int]:
    """Messages split so that each chat ``streaming_prefill`` call carries one audio chunk.

    The model's streaming audio path encodes exactly one chunk per call (``first`` samples for
    the first chunk of a session, then ``later``); a longer waveform in one call fails inside
    ``get_omni_embedding``. User audio is cut into such chunks, a short chunk that is not the
    last one is padded with silence (the streaming mel front end needs whole chunks); system
    and assistant messages go in whole. Returns the segments and the index of the one that
    gets ``is_last_chunk`` (the last user audio chunk, which flushes the mel buffer).
    """
    out: list[dict[str, Any]] = []
    chunks: list[tuple[int, int, int]] = []  # (segment, item, full size)
    for msg in msgs:
        if msg["role"] != "user":
            out.append(msg)
            continue
        current: list[Any] = []
        for item in msg["content"]:
            if not isinstance(item, np.ndarray):
                current.append(item)
                continue
            pos = 0
            while pos < item.size:
                size = first if not chunks else later
                current.append(item[pos : pos + size])
                chunks.append((len(out), len(current) - 1, size))
                pos += size
                out.append({"role": "user", "content": current})
                current = []
        if current:
            out.append({"role": "user", "content": current})
    for seg_i, item_i, size in chunks[:-1]:
        chunk = out[seg_i]["content"][item_i]
        if chunk.size < size:
            out[seg_i]["content"][item_i] = np.concatenate(
                [chunk, np.zeros(size - chunk.size, dtype=chunk.dtype)]
            )
    last = chunks[-1][0] if chunks else len(out) - 1
    return out, last
