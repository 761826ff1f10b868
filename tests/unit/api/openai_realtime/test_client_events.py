"""What the client events accept: the SDKs' shapes, extra fields ignored, formats checked."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.openai_realtime import client_events as ce


def test_a_full_session_update_is_accepted_with_its_extras() -> None:
    event = ce.CLIENT_EVENTS.validate_python(
        {
            "type": "session.update",
            "event_id": "evt_1",
            "session": {
                "type": "realtime",
                "output_modalities": ["audio"],
                "instructions": "Be brief.",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                        "noise_reduction": None,
                    },
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"},
                },
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": "auto",
            },
        }
    )
    assert isinstance(event, ce.SessionUpdate)
    assert event.session.instructions == "Be brief."


@pytest.mark.parametrize(
    "audio",
    [{"format": {"type": "audio/pcm", "rate": 16000}}, {"format": {"type": "audio/pcmu"}}],
)
def test_other_audio_formats_are_refused(audio: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ce.CLIENT_EVENTS.validate_python(
            {"type": "session.update", "session": {"type": "realtime", "audio": {"input": audio}}}
        )


def test_items_and_responses() -> None:
    item = ce.CLIENT_EVENTS.validate_python(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        }
    )
    assert isinstance(item, ce.ItemCreate) and isinstance(item.item, ce.MessageItem)
    call = ce.CLIENT_EVENTS.validate_python(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "c", "output": "{}"},
        }
    )
    assert isinstance(call, ce.ItemCreate) and isinstance(call.item, ce.OtherItem)
    create = ce.CLIENT_EVENTS.validate_python(
        {"type": "response.create", "response": {"output_modalities": ["text"]}}
    )
    assert isinstance(create, ce.ResponseCreate)
    with pytest.raises(ValidationError):
        ce.CLIENT_EVENTS.validate_python(
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0}
        )
