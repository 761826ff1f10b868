"""omnicore/settings.py: the duration limit of a mode, and of particular API keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from omnicore.settings import Settings


def test_an_api_key_has_its_own_duration_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "OMNISERVE_API_KEY_DURATIONS", '[{"key": "long-key", "audio_s": 1800, "video_s": 900}]'
    )
    s = Settings()
    assert s.duration_limit("audio") == 600 and s.duration_limit("video") == 300
    assert s.duration_limit("audio", "long-key") == 1800
    assert s.duration_limit("video", "long-key") == 900
    assert s.duration_limit("chat", "long-key") == 600  # not named: the deployment's limit
    assert s.duration_limit("audio", "other-key") == 600
    assert "long-key" in s.secret_values()  # never logged
    assert "long-key" not in repr(s)


def test_a_bad_key_entry_is_refused() -> None:
    with pytest.raises(ValidationError):
        Settings(api_key_durations=[{"key": "k", "audio_s": 0}])
    with pytest.raises(ValidationError):
        Settings(api_key_durations=[{"key": "k", "audio": 10}])
