"""tasks/chat_request.py: a client-named voice reaches the backend only as a checked real path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inference import UnsupportedInput
from omnicore.audio import write_wav
from tasks.chat_request import build_chat_request


def request(voice: str) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": "hi"}],
        "tts": {"enabled": True, "ref_audio_path": voice},
    }


def test_the_backend_gets_the_resolved_path(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    write_wav(voices / "real.wav", np.zeros(160, dtype=np.float32), 16_000)
    (voices / "alias.wav").symlink_to(voices / "real.wav")
    req = build_chat_request(request("alias.wav"), str(voices))
    assert req.tts.ref_audio_path == str(voices / "real.wav")
    assert (
        build_chat_request({"messages": [{"role": "user", "content": "x"}]}).tts.ref_audio_path
        is None
    )


@pytest.mark.parametrize("voices", [None, "voices"])
def test_a_path_outside_is_refused_before_any_read(tmp_path: Path, voices: str | None) -> None:
    (tmp_path / "voices").mkdir()
    write_wav(tmp_path / "secret.wav", np.zeros(160, dtype=np.float32), 16_000)
    root = str(tmp_path / voices) if voices else None
    with pytest.raises(UnsupportedInput) as refused:
        build_chat_request(request("../secret.wav"), root)
    assert refused.value.field_name == "tts.ref_audio_path"
