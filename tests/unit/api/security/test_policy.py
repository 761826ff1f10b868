"""api/security/policy.py and api/ops/access_log.py: the rules themselves, on hand-made requests.

The same rules against real gateway processes are in tests/e2e/test_security_access.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import HTTPException
from pydantic import SecretStr
from starlette.requests import Request

from api.ops.access_log import safe_target
from api.security.policy import (
    SecurityPolicy,
    is_loopback,
    key_matches,
    normalise_origin,
    origin_allowed,
    presented_key,
)
from omnicore.settings import Settings
from streaming.events import ErrorCode


def request(headers: dict[str, str] | None = None, query: str = "") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "headers": raw, "query_string": query.encode()})


def settings(**fields: Any) -> Settings:
    return Settings(**fields)


def test_keys_match_in_constant_time_shape() -> None:
    keys = [SecretStr("alpha-key-1"), SecretStr("beta-key-2")]
    assert key_matches("alpha-key-1", keys) and key_matches("beta-key-2", keys)
    for bad in (None, "", "alpha-key", "alpha-key-1 ", "ALPHA-KEY-1", "beta-key-2x"):
        assert not key_matches(bad, keys)
    assert not key_matches("anything", [])


def test_presented_key_header_first_then_query() -> None:
    assert presented_key(request({"Authorization": "Bearer k1"}, "api_key=k2")) == "k1"
    assert presented_key(request({"Authorization": "bearer   k1  "})) == "k1"
    assert presented_key(request(query="mode=chat&api_key=k2")) == "k2"
    assert presented_key(request({"Authorization": "Basic k1"}, "api_key=k2")) == "k2"
    assert presented_key(request({"Authorization": "Bearer "})) is None
    assert presented_key(request()) is None


@pytest.mark.parametrize(
    "origin,host,allowed,ok",
    [
        (None, "gw:8006", [], True),  # not a browser
        ("https://app.example", "gw", ["https://app.example"], True),
        ("https://APP.example:443", "gw", ["https://app.example/"], True),
        ("https://app.example:8443", "gw", ["https://app.example"], False),
        ("http://app.example", "gw", ["https://app.example"], False),  # scheme matters
        ("https://evil.example", "gw", ["https://app.example"], False),
        ("https://app.example.evil.example", "gw", ["https://app.example"], False),
        ("http://127.0.0.1:8006", "127.0.0.1:8006", [], True),  # the gateway's own page
        ("https://omni.example", "omni.example", [], True),
        ("https://omni.example", "omni.example:443", [], True),
        ("http://127.0.0.1:9999", "127.0.0.1:8006", [], False),
        ("http://[::1]:8006", "[::1]:8006", [], True),
        ("null", "gw", ["https://app.example"], False),
        ("null", "gw", ["*"], True),
        ("https://evil.example", None, [], False),
        ("not an origin", "gw", [], False),
        ("https://x.example", "gw", ["*"], True),
    ],
)
def test_origins(origin: str | None, host: str | None, allowed: list[str], ok: bool) -> None:
    assert origin_allowed(origin, host, allowed) is ok


def test_origin_setting_is_checked() -> None:
    assert settings(allowed_origins=["https://A.example/", "*"]).allowed_origins == [
        "https://A.example",
        "*",
    ]
    for bad in ("app.example", "https://app.example/path", "ftp://x", "https://u:p@x"):
        with pytest.raises(ValueError):
            settings(allowed_origins=[bad])
    assert normalise_origin("wss://h:443") == "wss://h"


def test_loopback_binds() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.1.2.3", "gateway.internal"):
        assert not is_loopback(host), host


def test_admin_guard() -> None:
    open_local = SecurityPolicy(settings(gateway_host="127.0.0.1"))
    open_local.check_admin(request())  # no token, loopback: open
    closed_public = SecurityPolicy(settings(gateway_host="0.0.0.0"))
    with pytest.raises(HTTPException) as refused:
        closed_public.check_admin(request({"Authorization": "Bearer anything"}))
    assert refused.value.status_code == 403
    guarded = SecurityPolicy(settings(gateway_host="0.0.0.0", admin_token="t0ken-xyz"))
    for bad in (None, "Bearer wrong", "t0ken-xyz", "Basic t0ken-xyz", "Bearer t0ken-xy"):
        with pytest.raises(HTTPException) as refused:
            guarded.check_admin(request({"Authorization": bad} if bad else None))
        assert refused.value.status_code == 401
    guarded.check_admin(request({"Authorization": "Bearer t0ken-xyz"}))
    guarded.check_admin(request({"Authorization": "bearer t0ken-xyz"}))
    empty = SecurityPolicy(settings(gateway_host="0.0.0.0", admin_token=""))
    with pytest.raises(HTTPException):  # an empty token is no token
        empty.check_admin(request({"Authorization": "Bearer "}))


def test_socket_checks_origin_then_key() -> None:
    policy = SecurityPolicy(
        settings(api_keys=["k-1"], allowed_origins=["https://app.example"], gateway_host="::")
    )
    assert policy.check_socket(request({"Authorization": "Bearer k-1"})) is None
    assert policy.check_socket(request({"Origin": "https://app.example"}, "api_key=k-1")) is None
    refused = policy.check_socket(request({"Origin": "https://evil.example"}, "api_key=k-1"))
    assert refused and refused.code is ErrorCode.ORIGIN_NOT_ALLOWED and refused.close_code == 1008
    refused = policy.check_socket(request(query="api_key=k-2"))
    assert refused and refused.code is ErrorCode.UNAUTHORIZED and refused.close_code == 1008
    assert policy.check_socket(request()) is not None


def test_startup_warnings_name_what_is_open() -> None:
    public = SecurityPolicy(settings(gateway_host="0.0.0.0", trusted_proxies=["0.0.0.0/0"]))
    text = " ".join(public.startup_warnings())
    for name in (
        "OMNISERVE_ADMIN_TOKEN",
        "OMNISERVE_API_KEYS",
        "OMNISERVE_MAX_CONNECTIONS_PER_CLIENT",
        "OMNISERVE_TRUSTED_PROXIES",
    ):
        assert name in text
    local = SecurityPolicy(settings(gateway_host="127.0.0.1"))
    assert len(local.startup_warnings()) == 1  # only the open admin endpoints
    locked = SecurityPolicy(
        settings(
            gateway_host="0.0.0.0",
            admin_token="t",
            api_keys=["k"],
            max_connections_per_client=4,
            trusted_proxies=["10.0.0.0/8"],
        )
    )
    assert locked.startup_warnings() == []


@pytest.mark.parametrize(
    "path,query,want",
    [
        ("/v1/realtime", "mode=chat&api_key=SECRET", "/v1/realtime?mode=chat"),
        ("/v1/realtime", "api_key=SECRET", "/v1/realtime"),
        ("/ws/chat", "", "/ws/chat"),
        ("/v1/realtime", "mode=%0Aforged&api_key=SECRET", "/v1/realtime?mode=(other)"),
    ],
)
def test_access_log_target_has_no_secrets(path: str, query: str, want: str) -> None:
    scope = {"path": path, "raw_path": path.encode(), "query_string": query.encode()}
    assert safe_target(scope) == want
    assert safe_target({"path": "/a\nb", "query_string": b""}) == "/a\\x0ab"
