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


def test_the_broker_is_the_shared_redis_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMNISERVE_BROKER_URL", raising=False)
    s = Settings(redis_url="redis://data:6379/0")
    assert s.broker == "redis://data:6379/0" and not s.separate_broker
    monkeypatch.setenv("OMNISERVE_BROKER_URL", "")  # empty: unset
    assert Settings().broker_url is None
    monkeypatch.setenv("OMNISERVE_BROKER_URL", "amqp://omni:rabbit-pw@mq:5672/omni")
    s = Settings(redis_url="redis://:redis-pw@data:6379/0")
    assert s.broker == "amqp://omni:rabbit-pw@mq:5672/omni" and s.separate_broker
    assert {"rabbit-pw", "redis-pw"} <= set(s.secret_values())  # never logged
    assert "rabbit-pw" not in repr(s) and "redis-pw" not in repr(s)
    assert not Settings(redis_url="redis://x/0", broker_url="redis://x/0").separate_broker


@pytest.mark.parametrize("url", ["http://mq:5672", "mq:5672", "kafka://mq", "redis+cluster://a:1/"])
def test_a_broker_url_of_another_kind_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="is not a broker"):
        Settings(broker_url=url)
