"""omnicore/voices.py: a client-named voice resolves inside the voices directory or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from omnicore.audio import write_wav
from omnicore.voices import VoiceError, resolve_voice


@pytest.fixture
def voices(tmp_path: Path) -> Path:
    """A voices directory with a voice, a voice in a subdirectory, and traps pointing out."""
    root = tmp_path / "voices"
    (root / "en").mkdir(parents=True)
    tone = np.zeros(1600, dtype=np.float32)
    write_wav(root / "alice.wav", tone, 16_000)
    write_wav(root / "en" / "bob.wav", tone, 16_000)
    secret = tmp_path / "secret.wav"
    write_wav(secret, tone, 16_000)
    (root / "out.wav").symlink_to(secret)  # a symlink leaving the directory
    (root / "outdir").symlink_to(tmp_path)  # a directory symlink leaving it
    (root / "inside.wav").symlink_to(root / "alice.wav")  # a symlink staying inside
    (root / ".hidden.wav").write_bytes(b"RIFF")
    os.mkfifo(root / "fifo.wav")
    (root / "loop.wav").symlink_to(root / "loop.wav")
    return root


def test_names_inside_resolve_to_real_files(voices: Path) -> None:
    assert resolve_voice(voices, "alice.wav") == voices / "alice.wav"
    assert resolve_voice(str(voices), "en/bob.wav") == voices / "en" / "bob.wav"
    assert resolve_voice(voices, "inside.wav") == voices / "alice.wav"


@pytest.mark.parametrize(
    "name",
    [
        "../secret.wav",  # parent
        "en/../../secret.wav",  # parent after a real part
        "en/../alice.wav",  # any '..' part, even one that stays inside
        "./alice.wav",
        "/etc/passwd",  # absolute
        "//etc/passwd",
        "out.wav",  # symlink to a file outside
        "outdir/secret.wav",  # through a directory symlink outside
        "%2e%2e/secret.wav",  # URL-encoded dots are not decoded, and '%' is refused
        "..%2fsecret.wav",
        "..\\secret.wav",  # backslash
        "C:/Windows/win.ini",
        "alice.wav\x00.txt",  # NUL
        "\uff0e\uff0e/secret.wav",  # fullwidth dots
        "alice\u0301.wav",  # combining accent: ASCII only
        "~/secret.wav",
        ".hidden.wav",
        "en/",  # empty part
        "en",  # a directory
        "fifo.wav",  # not a regular file (would block a reader)
        "loop.wav",  # symlink loop
        "missing.wav",
        "",
        "a" * 300,
    ],
)
def test_escapes_and_odd_names_are_refused(voices: Path, name: str) -> None:
    with pytest.raises(VoiceError) as refused:
        resolve_voice(voices, name)
    assert str(voices) not in str(refused.value)  # never tells the client where it looked


def test_no_voices_directory_refuses_everything(voices: Path, tmp_path: Path) -> None:
    for configured in (None, ""):
        with pytest.raises(VoiceError, match="not enabled"):
            resolve_voice(configured, "alice.wav")
    with pytest.raises(VoiceError, match="not available"):
        resolve_voice(tmp_path / "nowhere", "alice.wav")
