"""The server events are what the ``openai`` SDK's own types accept (validated strictly)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from api.openai_realtime.server_events import (
    ServerEvents,
    error_type,
    message_item,
    response_object,
    session_object,
)
from streaming.events import ErrorCode

types = pytest.importorskip("openai.types.realtime")
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(types.RealtimeServerEvent)


def test_event_ids_are_unique_per_connection() -> None:
    events = ServerEvents()
    ids = {events.event("input_audio_buffer.cleared")["event_id"] for _ in range(5)}
    assert len(ids) == 5


def test_session_events_validate() -> None:
    config = {
        "output_modalities": ["audio"],
        "instructions": "Be brief.",
        "audio_input": {"turn_detection": {"type": "semantic_vad"}},
        "audio_output": {"voice": "marin", "speed": 1.0},
    }
    for kind in ("session.created", "session.updated"):
        frame = ServerEvents().event(kind, session=session_object("rt_1", "m", config))
        parsed = SERVER_EVENT.validate_python(frame)
        assert parsed.session.audio.input.turn_detection.type == "semantic_vad"
        assert parsed.session.audio.output.format.rate == 24000


def test_waiting_room_is_a_rate_limits_event() -> None:
    parsed = SERVER_EVENT.validate_python(ServerEvents().rate_limits(3, 12.5))
    (limit,) = parsed.rate_limits
    assert (limit.name, limit.limit, limit.remaining, limit.reset_seconds) == (
        "requests",
        3,
        0,
        12.5,
    )


def test_errors_carry_type_code_param_and_event_id() -> None:
    frame = ServerEvents().error(
        "invalid_value", "bad", error_type(ErrorCode.INVALID_PAYLOAD), "audio", "evt_1"
    )
    err = SERVER_EVENT.validate_python(frame).error
    assert (err.type, err.code, err.param, err.event_id) == (
        "invalid_request_error",
        "invalid_value",
        "audio",
        "evt_1",
    )
    assert error_type(ErrorCode.BACKEND_ERROR) == "server_error"


@pytest.mark.parametrize("status", ["completed", "cancelled", "failed", "in_progress"])
def test_response_done_validates(status: str) -> None:
    item = message_item("item_1", "assistant", [{"type": "output_audio", "transcript": "hi"}])
    response = response_object(
        "resp_1",
        status,
        ["audio"],
        [item],
        reason="client_cancelled" if status == "cancelled" else None,
        usage={"input_tokens": 3, "output_tokens": 2},
    )
    parsed = SERVER_EVENT.validate_python(ServerEvents().event("response.done", response=response))
    assert parsed.response.status == status
    assert parsed.response.usage.total_tokens == 5
    assert parsed.response.output[0].content[0].transcript == "hi"
