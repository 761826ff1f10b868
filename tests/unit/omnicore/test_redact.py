"""omnicore/redact.py and the log setup: no secret reaches a log line, whoever writes it."""

from __future__ import annotations

import io
import logging

import pytest

from omnicore.redact import RedactingFormatter, redact, redact_url
from omnicore.settings import Settings


@pytest.mark.parametrize(
    "url,want",
    [
        ("redis://:s3cretpw@redis:6379/0", "redis://:***@redis:6379/0"),
        ("redis://user:s3cretpw@redis:6379/0", "redis://user:***@redis:6379/0"),
        ("rediss://:p%40ss@host/1", "rediss://:***@host/1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_redact_url(url: str, want: str) -> None:
    assert redact_url(url) == want


def test_redact_text() -> None:
    line = (
        '127.0.0.1:5 - "WebSocket /v1/realtime?mode=chat&api_key=k-123&x=1" [accepted] '
        "Authorization: Bearer tok.en-9 and redis://:pw@h:1/0 and ?token=abc;key=zz"
    )
    out = redact(line)
    for secret in ("k-123", "tok.en-9", ":pw@", "abc", "zz"):
        assert secret not in out
    assert "mode=chat" in out and "&x=1" in out and "api_key=***" in out
    assert redact("the key is KEY-0123456789", ["KEY-0123456789"]) == "the key is ***"
    assert redact("short a b", ["a"]) == "short a b"  # too short to replace literally


def test_formatter_cleans_message_arguments_and_traceback() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter("%(message)s", ["LITERAL-SECRET-42"]))
    logger = logging.getLogger("tests.redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("path %s", "/v1/realtime?api_key=LITERAL-SECRET-42")
        try:
            raise RuntimeError("cannot reach redis://:hunter2pw@redis:6379/0")
        except RuntimeError:
            logger.exception("failed with %s", "LITERAL-SECRET-42 inside")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "LITERAL-SECRET-42" not in out and "hunter2pw" not in out
    assert "RuntimeError" in out and "api_key=***" in out


def test_settings_list_their_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNISERVE_API_KEYS", '["key-one-111", "key-two-222"]')
    monkeypatch.setenv("OMNISERVE_ADMIN_TOKEN", "admin-333")
    monkeypatch.setenv("OMNISERVE_REDIS_URL", "redis://:redispw444@redis:6379/0")
    s = Settings()
    assert sorted(s.secret_values()) == ["admin-333", "key-one-111", "key-two-222", "redispw444"]
    assert "key-one-111" not in repr(s) and "admin-333" not in repr(s)


def test_settings_repr_hides_the_redis_password() -> None:
    settings = Settings(redis_url="redis://:s3cretpw@redis:6379/0", api_keys=["k-123456789"])
    for text in (repr(settings), str(settings)):
        assert "s3cretpw" not in text and "k-123456789" not in text
        assert "redis://:***@redis:6379/0" in text
    assert settings.redis_url == "redis://:s3cretpw@redis:6379/0"  # the value itself is whole
