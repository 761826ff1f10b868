"""api/official/assets.py: presets and voices never reach a file outside the voices directory."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
import soundfile

from api.official.assets import (
    AssetError,
    default_voice,
    find_voice,
    list_voices,
    load_presets,
    preset_audio,
)


@pytest.fixture
def voices(tmp_path: Path) -> Path:
    root = tmp_path / "voices"
    (root / "sub").mkdir(parents=True)
    soundfile.write(root / "a.wav", np.full(16000, 0.1), 16000)
    soundfile.write(root / "sub" / "b.wav", np.zeros(4000), 16000)
    secret = tmp_path / "secret.wav"
    soundfile.write(secret, np.full(16000, 0.5), 16000)
    (root / "link.wav").symlink_to(secret)  # leads out of the directory
    (root / "bad.wav").write_bytes(b"RIFF but not audio")
    return root


def test_find_voice_by_name_then_file_name(voices: Path) -> None:
    assert find_voice(str(voices), "sub/b.wav") == (voices / "sub" / "b.wav").resolve()
    assert find_voice(str(voices), "assets/ref_audio/a.wav") == (voices / "a.wav").resolve()
    # the fallback is a file name inside the directory, whatever the path said
    assert find_voice(str(voices), "../../elsewhere/a.wav") == (voices / "a.wav").resolve()


@pytest.mark.parametrize(
    "name",
    ["../secret.wav", "/etc/passwd", "link.wav", "x/../../secret.wav", "sub/../../secret.wav"],
)
def test_find_voice_refuses_what_leads_out(voices: Path, name: str) -> None:
    with pytest.raises(AssetError) as err:
        find_voice(str(voices), name)
    assert err.value.status == 404
    assert str(voices.parent) not in err.value.detail  # no server paths in answers


def test_find_voice_without_a_directory() -> None:
    with pytest.raises(AssetError):
        find_voice(None, "a.wav")


def test_default_voice(voices: Path) -> None:
    got = default_voice(str(voices), "a.wav")
    pcm = np.frombuffer(base64.b64decode(got["base64"]), dtype="<f4")
    assert got["samples"] == pcm.size == 16000 and got["duration"] == 1.0
    assert np.allclose(pcm, 0.1, atol=1e-3)
    # unset: the directory's first voice by name; no directory or no voice: 404
    assert default_voice(str(voices), None)["name"] == "a.wav"
    with pytest.raises(AssetError) as err:
        default_voice(None, None)
    assert err.value.status == 404
    with pytest.raises(AssetError) as err:
        default_voice(str(voices / "sub" / "empty"), None)
    assert err.value.status == 404
    with pytest.raises(AssetError) as err:
        default_voice(str(voices), "bad.wav")
    assert err.value.status == 422


def test_presets_never_load_outside_the_voices_dir(voices: Path, tmp_path: Path) -> None:
    presets = tmp_path / "presets"
    (presets / "omni").mkdir(parents=True)
    (presets / "omni" / "p.yaml").write_text(
        "id: p\nref_audio_path: ../secret.wav\n"
        "system_content:\n  - {type: audio, path: /tmp/../etc/passwd}\n  - {type: text, text: hi}\n"
    )
    (presets / "omni" / "list.yaml").write_text("- not\n- a mapping\n")
    (presets / "omni" / "notes.txt").write_text("ignored")
    found = load_presets(str(presets), str(voices))
    (p,) = found["omni"]
    assert p["ref_audio"]["duration"] == 0.0 and p["ref_audio"]["data"] is None
    assert p["system_content"][0]["duration"] == 0.0
    loaded = preset_audio(found, "omni", "p", str(voices))
    assert loaded["ref_audio"]["data"] is None
    assert loaded["system_content_audio"] == [{"data": None, "name": "passwd", "duration": 0}]
    with pytest.raises(AssetError):
        preset_audio(found, "omni", "missing", str(voices))
    assert load_presets(None, str(voices)) == {}
    assert load_presets(str(tmp_path / "nowhere"), str(voices)) == {}


def test_list_voices_shows_only_usable_names(voices: Path) -> None:
    (voices / ".hidden.wav").write_bytes(b"x")
    listed = list_voices(str(voices))
    ids = [v["id"] for v in listed["ref_audios"]]
    assert ids == ["a.wav", "bad.wav", "sub/b.wav"]  # not the symlink out, not hidden files
    assert listed["total"] == 3
    assert list_voices(None) == {"total": 0, "ref_audios": []}
