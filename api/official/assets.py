"""The files the official demo's pages ask for: presets, the default voice, the voice list.

Every audio file named here is a voice inside ``OMNISERVE_VOICES_DIR``, resolved by
``omnicore.voices`` (the same rule as ``tts.ref_audio_path``), so no request and no preset file
can make the gateway read anything else. Audio goes out as the official gateway sends it: mono
float32 PCM at 16 kHz, base64.

Presets are the demo's own files: ``OMNISERVE_PRESETS_DIR/<page>/*.yaml`` (its
``assets/presets``). A preset names its audio with demo-relative paths such as
``assets/ref_audio/ref_en_dlc_1.wav``; such a path is looked up in the voices directory as given,
then by its file name alone, so copying the demo's ``assets/ref_audio`` files into the voices
directory is enough.
"""

from __future__ import annotations

import base64
import logging
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from omnicore.audio import INPUT_RATE, AudioFormatError, load_voice
from omnicore.voices import VoiceError, check_voice_name, resolve_voice

log = logging.getLogger("omniserve.gateway")

VOICE_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
MAX_VOICES_LISTED = 500


class AssetError(Exception):
    """A file that cannot be served; ``status`` is the HTTP answer (404, 422)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def find_voice(voices_dir: str | None, name: str) -> Path:
    """A voice by its name in the voices directory, else by its file name alone."""
    try:
        return resolve_voice(voices_dir, name)
    except VoiceError as first:
        base = name.rsplit("/", 1)[-1]
        if base == name:
            raise AssetError(404, str(first)) from None
        try:
            return resolve_voice(voices_dir, base)
        except VoiceError:
            raise AssetError(404, str(first)) from None


@lru_cache(maxsize=32)
def _decoded(path: str, mtime_ns: int, size: int) -> tuple[str, int]:
    """A voice file's samples (base64 float32, 16 kHz) and their count, decoded once per
    version of the file (the pages fetch the same voices on every load)."""
    samples = load_voice(path, INPUT_RATE)
    return base64.b64encode(samples.astype("<f4").tobytes()).decode("ascii"), int(samples.size)


def _decode(path: Path) -> tuple[str, int]:
    st = path.stat()
    return _decoded(str(path), st.st_mtime_ns, st.st_size)


def voice_payload(path: Path, name: str) -> dict[str, Any]:
    """A voice file as the official gateway sends it (16 kHz mono float32, base64)."""
    try:
        data, count = _decode(path)
    except (AudioFormatError, OSError, RuntimeError) as exc:
        raise AssetError(422, f"voice {name!r} is not a readable audio file: {exc}") from None
    return {
        "name": path.name,
        "duration": round(count / INPUT_RATE, 1),
        "sample_rate": INPUT_RATE,
        "samples": count,
        "base64": data,
    }


def default_voice(voices_dir: str | None, name: str | None) -> dict[str, Any]:
    """``GET /api/default_ref_audio``: ``OMNISERVE_DEFAULT_VOICE`` from the voices directory;
    unset, the directory's first voice by name (the pages load a default voice on every visit)."""
    if not name:
        listed = list_voices(voices_dir)["ref_audios"]
        if not listed:
            raise AssetError(404, "No default ref audio configured")
        name = str(listed[0]["id"])
    return voice_payload(find_voice(voices_dir, name), name)


def _duration(voices_dir: str | None, name: str) -> tuple[str, float]:
    """A preset voice's file name and duration; duration 0 when it cannot be served (the demo
    answers the same for a missing file)."""
    try:
        path = find_voice(voices_dir, name)
        _, count = _decode(path)
        return path.name, round(count / INPUT_RATE, 1)
    except (AssetError, AudioFormatError, OSError, RuntimeError):
        return name.rsplit("/", 1)[-1], 0.0


def _resolve_preset(preset: dict[str, Any], voices_dir: str | None) -> dict[str, Any]:
    """A preset with its audio described (name, duration) but not loaded, as the demo lists it."""
    out = dict(preset)
    items = out.get("system_content")
    if isinstance(items, list):
        resolved = []
        for item in items:
            if isinstance(item, dict) and item.get("type") == "audio" and item.get("path"):
                name, duration = _duration(voices_dir, str(item["path"]))
                item = {**item, "data": None, "name": name, "duration": duration}
            resolved.append(item)
        out["system_content"] = resolved
    ref = out.pop("ref_audio_path", None)
    if ref:
        name, duration = _duration(voices_dir, str(ref))
        out["ref_audio"] = {"data": None, "path": ref, "name": name, "duration": duration}
    return out


def load_presets(presets_dir: str | None, voices_dir: str | None) -> dict[str, list[Any]]:
    """``GET /api/presets``: ``{page: [preset, ...]}`` ordered by each preset's ``order``."""
    if not presets_dir:
        return {}
    root = Path(presets_dir)
    if not root.is_dir():
        log.warning("OMNISERVE_PRESETS_DIR is not a directory; no presets are served")
        return {}
    result: dict[str, list[Any]] = {}
    for page in sorted(p for p in root.iterdir() if p.is_dir()):
        presets = []
        for file in sorted(page.iterdir()):
            if file.suffix not in (".yaml", ".yml") or not file.is_file():
                continue
            try:
                preset = yaml.safe_load(file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
                log.warning("preset %s/%s skipped: %s", page.name, file.name, exc)
                continue
            if isinstance(preset, dict):
                presets.append(_resolve_preset(preset, voices_dir))
        if presets:
            presets.sort(key=lambda p: p.get("order", 999) if isinstance(p, dict) else 999)
            result[page.name] = presets
    return result


def preset_audio(
    presets: dict[str, list[Any]], page: str, preset_id: str, voices_dir: str | None
) -> dict[str, Any]:
    """``GET /api/presets/{page}/{id}/audio``: the preset's audio, loaded."""
    preset = next((p for p in presets.get(page, []) if p.get("id") == preset_id), None)
    if preset is None:
        raise AssetError(404, f"Preset not found: {page}/{preset_id}")

    def load(path: str, fallback: str) -> dict[str, Any]:
        try:
            loaded = voice_payload(find_voice(voices_dir, path), path)
        except AssetError:
            return {"data": None, "name": fallback, "duration": 0}
        return {"data": loaded["base64"], "name": loaded["name"], "duration": loaded["duration"]}

    out: dict[str, Any] = {}
    items = preset.get("system_content")
    if isinstance(items, list):
        out["system_content_audio"] = [
            load(str(item["path"]), str(item.get("name", "")))
            for item in items
            if isinstance(item, dict) and item.get("type") == "audio" and item.get("path")
        ]
    ref = preset.get("ref_audio")
    if isinstance(ref, dict) and ref.get("path"):
        out["ref_audio"] = load(str(ref["path"]), str(ref.get("name", "")))
    return out


def list_voices(voices_dir: str | None) -> dict[str, Any]:
    """``GET /api/assets/ref_audio``: the voice files of the voices directory
    (``RefAudioListResponse``; ``id`` is the voice name a client may use)."""
    if not voices_dir or not Path(voices_dir).is_dir():
        return {"total": 0, "ref_audios": []}
    root = Path(voices_dir).resolve()
    out: list[dict[str, Any]] = []
    for path in sorted(root.rglob("*")):
        if len(out) >= MAX_VOICES_LISTED:
            break
        if path.suffix.lower() not in VOICE_SUFFIXES or not path.is_file():
            continue
        name = path.relative_to(root).as_posix()
        try:
            check_voice_name(name)
            real = resolve_voice(root, name)
        except VoiceError:
            continue  # hidden, oddly named, or a symlink leading out: not a usable voice
        st = real.stat()
        out.append(
            {
                "id": name,
                "name": path.stem,
                "filename": name,
                "source_type": "voices_dir",
                "duration_ms": None,  # not decoded for a listing
                "sample_rate": INPUT_RATE,
                "created_at": datetime.fromtimestamp(st.st_mtime, UTC).isoformat(),
            }
        )
    return {"total": len(out), "ref_audios": out}
