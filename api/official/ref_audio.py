"""``POST``/``DELETE /api/assets/ref_audio``: reference voices uploaded into the voices directory.

The official gateway takes ``{name, audio_base64}`` (an audio file in any format it can decode),
stores it as 16 kHz mono 16-bit WAV and answers ``RefAudioResponse {success, id, name,
message}``; ``DELETE /api/assets/ref_audio/{id}`` removes it (404 when unknown). Here the file
goes into ``OMNISERVE_VOICES_DIR`` as ``<name>.wav`` and its ``id`` is that voice name, the one
clients then use (``tts.ref_audio_path``, a ``/ws/duplex`` prepare's ``ref_audio_path``,
``OMNISERVE_DEFAULT_VOICE``) and ``GET /api/assets/ref_audio`` lists.

Checked before anything is written: the name is one plain file name (``omnicore/voices.py``'s
rule, no ``/``: nothing outside the directory, no hidden file), the decoded upload is at most
``OMNISERVE_REF_AUDIO_MAX_BYTES`` and decodes as audio of at most ``OMNISERVE_REF_AUDIO_MAX_S``;
an existing voice is not replaced (409). The file is written under a temporary name and renamed,
so a reader never sees half a voice. A delete removes only a regular file inside the directory.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, StrictStr

from api.official.assets import VOICE_SUFFIXES, AssetError
from omnicore.audio import INPUT_RATE, AudioFormatError, load_voice, wav_bytes
from omnicore.voices import VoiceError, check_voice_name, resolve_voice


class UploadRefAudio(BaseModel):
    """The official ``UploadRefAudioRequest``."""

    name: StrictStr
    audio_base64: StrictStr


def _voices_root(voices_dir: str | None) -> Path:
    if not voices_dir or not Path(voices_dir).is_dir():
        raise AssetError(503, "OMNISERVE_VOICES_DIR is not set or not a directory")
    return Path(voices_dir).resolve()


def voice_file_name(name: str) -> str:
    """The file an upload named ``name`` is stored as: ``<name>.wav``, one plain file name."""
    stem = name.strip()
    lower = stem.lower()
    for suffix in VOICE_SUFFIXES:
        if lower.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    file_name = f"{stem}.wav"
    try:
        parts = check_voice_name(file_name)
    except VoiceError as exc:
        raise AssetError(400, f"invalid name: {exc}") from None
    if len(parts) != 1:
        raise AssetError(400, "invalid name: a voice name is one file name (no '/')")
    return file_name


def upload(voices_dir: str | None, body: UploadRefAudio, max_bytes: int, max_s: float) -> str:
    """Store an uploaded voice; returns its id (its voice name). AssetError when refused."""
    root = _voices_root(voices_dir)
    file_name = voice_file_name(body.name)
    if len(body.audio_base64) > (max_bytes * 4) // 3 + 8:
        raise AssetError(413, f"audio too large (max {max_bytes} bytes)")
    try:
        raw = base64.b64decode(body.audio_base64, validate=True)
    except (binascii.Error, ValueError):
        raise AssetError(400, "audio_base64 is not valid base64") from None
    if not raw:
        raise AssetError(400, "audio_base64 is empty")
    if len(raw) > max_bytes:
        raise AssetError(413, f"audio too large (max {max_bytes} bytes)")
    try:
        samples = load_voice(raw, INPUT_RATE)
    except (AudioFormatError, RuntimeError, ValueError, TypeError) as exc:
        raise AssetError(400, f"cannot decode the audio file: {str(exc)[:120]}") from None
    if samples.size == 0:
        raise AssetError(400, "the audio file holds no samples")
    duration = samples.size / INPUT_RATE
    if duration > max_s:
        raise AssetError(413, f"audio too long ({duration:.1f} s, max {max_s:.0f} s)")
    target = root / file_name
    data = wav_bytes(samples, INPUT_RATE)
    fd, tmp = tempfile.mkstemp(prefix=".upload-", suffix=".wav", dir=root)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            os.link(tmp, target)  # never replaces: an existing voice stays as it is
        except FileExistsError:
            raise AssetError(409, f"ref audio {file_name!r} exists already") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return file_name


def uploaded(file_name: str, name: str, voices_dir: str | None) -> dict[str, Any]:
    """The official ``RefAudioResponse`` of an upload."""
    path = resolve_voice(voices_dir, file_name)
    samples = load_voice(path, INPUT_RATE)
    return {
        "success": True,
        "id": file_name,
        "name": name,
        "message": f"Uploaded successfully, duration={int(samples.size * 1000 / INPUT_RATE)}ms",
    }


def delete(voices_dir: str | None, ref_id: str) -> None:
    """Remove a voice of the voices directory; AssetError (404) when there is no such voice."""
    root = _voices_root(voices_dir)
    try:
        path = resolve_voice(root, ref_id)
    except VoiceError:
        raise AssetError(404, f"Ref audio not found: {ref_id}") from None
    if path.suffix.lower() not in VOICE_SUFFIXES:
        raise AssetError(404, f"Ref audio not found: {ref_id}")
    # the name as given (a symlink inside the directory is removed, not what it points to)
    root.joinpath(*check_voice_name(ref_id)).unlink()
