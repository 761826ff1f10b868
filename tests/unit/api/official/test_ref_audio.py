"""Uploaded voices: plain names only, checked audio, never outside the voices directory."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import soundfile

from api.official.assets import AssetError
from api.official.ref_audio import UploadRefAudio, delete, upload, voice_file_name

NOT_AUDIO = base64.b64encode(b"x" * 99).decode()


def _wav(seconds: float = 0.3) -> str:
    buf = io.BytesIO()
    soundfile.write(buf, np.zeros(int(8000 * seconds)), 8000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "x y", "a\\b", "%2e%2e"])
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(AssetError) as err:
        voice_file_name(name)
    assert err.value.status == 400


def test_a_name_is_stored_as_a_wav_file() -> None:
    assert voice_file_name("voice") == "voice.wav"
    assert voice_file_name("voice.mp3") == "voice.wav"


def test_upload_resamples_and_never_replaces(tmp_path: Path) -> None:
    ref = upload(str(tmp_path), UploadRefAudio(name="v", audio_base64=_wav()), 10**6, 10)
    assert ref == "v.wav"
    assert soundfile.info(tmp_path / "v.wav").samplerate == 16000
    with pytest.raises(AssetError) as err:
        upload(str(tmp_path), UploadRefAudio(name="v", audio_base64=_wav()), 10**6, 10)
    assert err.value.status == 409
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.wav"]


def test_limits_and_formats(tmp_path: Path) -> None:
    cases = [
        (UploadRefAudio(name="a", audio_base64=_wav(2.0)), 10**6, 1.0, 413),
        (UploadRefAudio(name="b", audio_base64=_wav(1.0)), 2000, 10, 413),
        (UploadRefAudio(name="c", audio_base64=NOT_AUDIO), 10**6, 10, 400),
        (UploadRefAudio(name="d", audio_base64="not base64!"), 10**6, 10, 400),
    ]
    for body, max_bytes, max_s, status in cases:
        with pytest.raises(AssetError) as err:
            upload(str(tmp_path), body, max_bytes, max_s)
        assert err.value.status == status, body.name
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(AssetError) as err:
        upload(None, UploadRefAudio(name="e", audio_base64=_wav()), 10**6, 10)
    assert err.value.status == 503


def test_delete_stays_inside_the_directory(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    (tmp_path / "outside.wav").write_bytes(b"RIFF")
    (voices / "link.wav").symlink_to(tmp_path / "outside.wav")
    (voices / "notes.txt").write_text("not a voice")
    for name in ("../outside.wav", "link.wav", "notes.txt", "missing.wav"):
        with pytest.raises(AssetError) as err:
            delete(str(voices), name)
        assert err.value.status == 404, name
    assert (tmp_path / "outside.wav").exists() and (voices / "notes.txt").exists()
    upload(str(voices), UploadRefAudio(name="mine", audio_base64=_wav()), 10**6, 10)
    delete(str(voices), "mine.wav")
    assert not (voices / "mine.wav").exists()
