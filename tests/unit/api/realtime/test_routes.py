"""``/v1/realtime`` and ``/ws/chat`` in process: the real app and its lifespan on the run's Redis,
driven by Starlette's TestClient (``tests/support/in_process_gateway.py``), for every path a
client takes before a worker serves it. The same paths with a worker, over real sockets:
tests/e2e/test_conformance.py and tests/e2e/test_security_access.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import WebSocketTestSession

from tests.support.in_process_gateway import InProcessGateway, close_code, in_process_gateway, until

pytestmark = pytest.mark.timeout(30)  # a receive waits for ever; this bounds a hung test

KEY = "in-process-key"
USER = {"role": "user", "content": "x"}


@pytest.fixture(scope="module")
def gateway(redis_server: str) -> Iterator[InProcessGateway]:
    """One app for the module's tests that need no setting of their own."""
    with in_process_gateway(redis_server) as gw:
        yield gw


@pytest.fixture(scope="module")
def guarded(redis_server: str) -> Iterator[InProcessGateway]:
    """An app that wants an API key and lets in pages of one other origin."""
    with in_process_gateway(
        redis_server, api_keys=[KEY], allowed_origins=["https://app.example"]
    ) as gw:
        yield gw


def error_of(ws: WebSocketTestSession, frame: Any) -> dict[str, Any]:
    """Send ``frame`` (text as is, anything else as JSON); the ``error`` object it gets."""
    if isinstance(frame, str):
        ws.send_text(frame)
    else:
        ws.send_json(frame)
    error: dict[str, Any] = until(ws, "error")["error"]
    return error


# --------------------------------------------------------------------------- let in or refused


def test_an_unknown_mode_is_refused_with_its_field(gateway: InProcessGateway) -> None:
    with gateway.client.websocket_connect("/v1/realtime?mode=karaoke") as ws:
        error = until(ws, "error")["error"]
        assert (error["code"], error["field"]) == ("invalid_payload", "mode")
        assert close_code(ws) == 1008


def test_a_duplex_client_with_no_worker_at_all_is_told_and_closed_1013(
    gateway: InProcessGateway,
) -> None:
    with gateway.client.websocket_connect("/v1/realtime?mode=audio") as ws:
        error = until(ws, "error")["error"]
        assert error["code"] == "service_unavailable" and error["type"] == "server_error"
        assert "no worker" in error["message"]
        assert close_code(ws) == 1013


@pytest.mark.parametrize("path", ["/v1/realtime?mode=chat", "/ws/chat"])
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + KEY}],
    ids=["no key", "wrong key", "not bearer"],
)
def test_a_client_without_the_key_is_refused_1008(
    guarded: InProcessGateway, path: str, headers: dict[str, str]
) -> None:
    with guarded.client.websocket_connect(path, headers=headers) as ws:
        frame = ws.receive_json()
        if path == "/ws/chat":
            assert frame == {"type": "error", "error": "missing or invalid API key"}
        else:
            assert (frame["type"], frame["error"]["code"]) == ("error", "unauthorized")
        assert close_code(ws) == 1008


@pytest.mark.parametrize("how", ["bearer", "query"])
def test_a_client_with_the_key_is_let_in(guarded: InProcessGateway, how: str) -> None:
    headers = {"Authorization": f"Bearer {KEY}"} if how == "bearer" else {}
    query = f"&api_key={KEY}" if how == "query" else ""
    with guarded.client.websocket_connect(f"/v1/realtime?mode=chat{query}", headers=headers) as ws:
        assert ws.receive_json()["type"] == "session.queue_done"  # chat holds no slot yet


@pytest.mark.parametrize("path", ["/v1/realtime?mode=chat", "/ws/chat"])
def test_a_page_of_another_origin_is_refused_1008(guarded: InProcessGateway, path: str) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "Origin": "https://evil.example"}
    with guarded.client.websocket_connect(path, headers=headers) as ws:
        frame = ws.receive_json()
        if path == "/ws/chat":
            assert frame == {"type": "error", "error": "origin not allowed"}
        else:
            assert frame["error"]["code"] == "origin_not_allowed"
        assert close_code(ws) == 1008


@pytest.mark.parametrize("origin", ["https://app.example", "http://testserver"])
def test_a_listed_origin_and_the_gateways_own_are_let_in(
    guarded: InProcessGateway, origin: str
) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "Origin": origin}
    with guarded.client.websocket_connect("/v1/realtime?mode=chat", headers=headers) as ws:
        assert ws.receive_json()["type"] == "session.queue_done"


def test_the_sdks_subprotocol_marker_is_selected(gateway: InProcessGateway) -> None:
    with gateway.client.websocket_connect(
        "/v1/realtime?mode=chat", subprotocols=["map.realtime", "other"]
    ) as ws:
        assert ws.accepted_subprotocol == "map.realtime"
        assert ws.receive_json()["type"] == "session.queue_done"


def test_a_client_past_its_connection_limit_is_refused_1013(redis_server: str) -> None:
    with (
        in_process_gateway(redis_server, max_connections_per_client=1) as gw,
        gw.client.websocket_connect("/v1/realtime?mode=chat") as first,
    ):
        assert first.receive_json()["type"] == "session.queue_done"
        for path in ("/v1/realtime?mode=chat", "/ws/chat"):
            with gw.client.websocket_connect(path) as second:
                frame = second.receive_json()
                if path == "/ws/chat":
                    assert "too many connections" in frame["error"]
                else:
                    assert frame["error"]["code"] == "too_many_connections"
                assert close_code(second) == 1013


# --------------------------------------------------------------------------- the queue


def test_a_duplex_client_queues_for_a_worker_that_is_loading(redis_server: str) -> None:
    with in_process_gateway(redis_server) as gw:
        gw.loading_worker(slots=1)
        with gw.client.websocket_connect("/v1/realtime?mode=audio") as ws:
            queued = until(ws, "session.queued")
            assert queued["position"] == 1
            # input before the session exists is a client error; the client stays queued
            not_ready = error_of(ws, {"type": "input.append", "input": {"audio": "AAAA"}})
            assert (not_ready["code"], not_ready["type"]) == ("not_ready", "client_error")
            bad_init = {"type": "session.init", "payload": {"system_prompt": 3}}
            error = error_of(ws, bad_init)
            assert (error["code"], error["field"]) == ("invalid_payload", "payload.system_prompt")
            ws.send_json({"type": "session.close", "reason": "user_stop"})
            assert until(ws, "session.closed")["reason"] == "user_stop"


# --------------------------------------------------------------------------- client events


@pytest.fixture
def chat(gateway: InProcessGateway) -> Iterator[WebSocketTestSession]:
    """A chat-mode connection, through its queue (at once: a chat session holds no slot)."""
    with gateway.client.websocket_connect("/v1/realtime?mode=chat") as ws:
        assert ws.receive_json()["type"] == "session.queue_done"
        yield ws


@pytest.mark.parametrize(
    "frame,code,field",
    [
        ({"type": "response.create"}, "unknown_event", "type"),
        ({"no_type": 1}, "missing_field", "type"),
        ({"type": 7}, "invalid_payload", "type"),
        ("[1, 2, 3]", "invalid_payload", "type"),
        ({"type": "session.init"}, "missing_field", "payload"),
        ({"type": "session.init", "payload": []}, "invalid_payload", "payload"),
        ({"type": "session.update"}, "missing_field", "session"),
    ],
)
def test_a_bad_event_gets_its_code_and_field_and_the_session_goes_on(
    chat: WebSocketTestSession, frame: Any, code: str, field: str
) -> None:
    error = error_of(chat, frame)
    assert (error["code"], error["field"], error["type"]) == (code, field, "client_error")
    chat.send_json({"type": "session.init", "payload": {}})
    assert until(chat, "session.created")["mode"] == "turn_based"


@pytest.mark.parametrize(
    "frame,code,field",
    [
        ({"type": "input.append"}, "missing_field", "input"),
        ({"type": "input.append", "input": {}}, "missing_field", "input.messages"),
        ({"type": "input.append", "input": {"messages": []}}, "invalid_payload", "input.messages"),
        (
            {"type": "input.append", "input": {"messages": [{"role": "robot", "content": "x"}]}},
            "invalid_payload",
            "input.messages[0].role",
        ),
        (
            {
                "type": "input.append",
                "input": {"messages": [USER], "generation": {"max_new_tokens": "many"}},
            },
            "invalid_payload",
            "input.generation.max_new_tokens",
        ),
    ],
)
def test_a_bad_chat_turn_is_answered_with_its_field_before_any_worker(
    chat: WebSocketTestSession, frame: dict[str, Any], code: str, field: str
) -> None:
    chat.send_json({"type": "session.init", "payload": {}})
    until(chat, "session.created")
    error = error_of(chat, frame)
    assert (error["code"], error["field"]) == (code, field)
    assert field.split("[")[0].split(".")[-1] in error["message"]
    again = error_of(chat, frame)  # the session went on: the same mistake, the same answer
    assert (again["code"], again["field"]) == (code, field)


def test_a_second_init_is_refused(chat: WebSocketTestSession) -> None:
    chat.send_json({"type": "session.init", "payload": {}})
    until(chat, "session.created")
    error = error_of(chat, {"type": "session.init", "payload": {}})
    assert (error["code"], error["field"]) == ("invalid_payload", "type")


def test_input_before_the_chat_session_is_created_is_not_ready(
    chat: WebSocketTestSession,
) -> None:
    error = error_of(chat, {"type": "input.append", "input": {"messages": [USER]}})
    assert error["code"] == "not_ready"


def test_a_chat_turn_with_no_worker_at_all_is_told_and_closed_1013(
    chat: WebSocketTestSession,
) -> None:
    chat.send_json({"type": "session.init", "payload": {}})
    until(chat, "session.created")
    chat.send_json({"type": "input.append", "input": {"messages": [USER]}})
    assert until(chat, "error")["error"]["code"] == "service_unavailable"
    assert close_code(chat) == 1013


@pytest.mark.parametrize("frame", ["this is not json {", b"\x00\x01"], ids=["text", "binary"])
def test_a_frame_that_is_not_json_closes_1003(chat: WebSocketTestSession, frame: Any) -> None:
    if isinstance(frame, bytes):
        chat.send_bytes(frame)
    else:
        chat.send_text(frame)
    assert close_code(chat) == 1003


# --------------------------------------------------------------------------- /ws/chat


@pytest.mark.parametrize(
    "request_,fragment",
    [
        ({"messages": []}, "messages"),
        ({"streaming": True}, "messages"),
        ({"messages": [USER], "tts": {"mode": "karaoke"}}, "tts.mode"),
        ({"messages": [{"role": "user", "content": [{"type": "audio", "data": "AAA="}]}]}, "data"),
    ],
)
def test_a_bad_legacy_request_gets_an_error_and_close_1000(
    gateway: InProcessGateway, request_: dict[str, Any], fragment: str
) -> None:
    with gateway.client.websocket_connect("/ws/chat") as ws:
        ws.send_json(request_)
        frame = ws.receive_json()
        assert frame["type"] == "error" and fragment in frame["error"]
        assert close_code(ws) == 1000


def test_a_legacy_frame_that_is_not_json_closes_1003(gateway: InProcessGateway) -> None:
    with gateway.client.websocket_connect("/ws/chat") as ws:
        ws.send_text("{{{")
        assert close_code(ws) == 1003
