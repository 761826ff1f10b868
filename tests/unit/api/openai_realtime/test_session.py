"""What a session sends goes through the OpenAI Agents SDK's own parsing
(``OpenAIRealtimeWebSocketModel``'s event handler) without a validation error, and becomes the
model events its ``RealtimeSession`` is built on; a session's items keep their status."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from api.openai_realtime.server_events import (
    ServerEvents,
    message_item,
    response_object,
    session_object,
)
from api.openai_realtime.session import ConversationItem

realtime = pytest.importorskip("agents.realtime.openai_realtime")
from agents.realtime.items import AssistantAudio, AssistantMessageItem  # noqa: E402
from agents.realtime.model import RealtimeModelListener  # noqa: E402 - after importorskip
from agents.realtime.model_events import RealtimeModelEvent  # noqa: E402

OpenAIRealtimeWebSocketModel = realtime.OpenAIRealtimeWebSocketModel


class Seen(RealtimeModelListener):
    def __init__(self) -> None:
        self.events: list[RealtimeModelEvent] = []

    async def on_event(self, event: RealtimeModelEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.type for e in self.events if e.type != "raw_server_event"]


async def parse(model: Any, frames: list[dict[str, Any]]) -> Seen:
    """Feeds ``frames`` to the library's handler for what arrives on its websocket."""
    seen = Seen()
    model.add_listener(seen)
    for frame in frames:
        await model._handle_ws_event(frame)
    assert not [e for e in seen.events if e.type in ("error", "exception")], seen.events
    return seen


@pytest.mark.parametrize("interrupt_response", [True, False])
async def test_session_updated_is_the_librarys_session(interrupt_response: bool) -> None:
    """The library keeps the echoed session: its ``interrupt_response`` decides whether
    ``session.interrupt()`` also sends ``response.cancel``; tools are accepted, none shown."""
    td = {"type": "semantic_vad", "interrupt_response": interrupt_response}
    config = {
        "output_modalities": ["audio"],
        "instructions": "Be brief.",
        "audio_input": {"turn_detection": td},
        "audio_output": {"voice": "ash", "speed": 1.0},
    }
    model = OpenAIRealtimeWebSocketModel()
    frame = ServerEvents().event("session.updated", session=session_object("rt_1", "m", config))
    await parse(model, [frame])
    session = model._created_session
    assert session is not None and session.tools == []
    assert session.audio.input.turn_detection.interrupt_response is interrupt_response


async def test_an_audio_response_becomes_the_librarys_turn() -> None:
    events = ServerEvents()
    where = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0}
    part = {"type": "audio", "transcript": "Hi there"}
    done_item = message_item(
        "item_1", "assistant", [{"type": "output_audio", "transcript": "Hi there"}], "incomplete"
    )
    pcm = base64.b64encode(b"\x01\x00" * 2400).decode()
    frames = [
        events.event(
            "response.created", response=response_object("resp_1", "in_progress", ["audio"], [])
        ),
        events.event(
            "response.output_item.added",
            response_id="resp_1",
            output_index=0,
            item=message_item("item_1", "assistant", [], "in_progress"),
        ),
        events.event(
            "response.content_part.added", **where, part={"type": "audio", "transcript": ""}
        ),
        events.event("response.output_audio_transcript.delta", **where, delta="Hi there"),
        events.event("response.output_audio.delta", **where, delta=pcm),
        events.event("response.output_audio.done", **where),
        events.event("response.output_audio_transcript.done", **where, transcript="Hi there"),
        events.event("response.content_part.done", **where, part=part),
        events.event(
            "response.output_item.done", response_id="resp_1", output_index=0, item=done_item
        ),
        events.event(
            "response.done",
            response=response_object(
                "resp_1",
                "cancelled",
                ["audio"],
                [done_item],
                reason="turn_detected",
                usage={"input_tokens": 3, "output_tokens": 2},
            ),
        ),
        events.event("conversation.item.retrieved", item=done_item),
    ]
    seen = await parse(OpenAIRealtimeWebSocketModel(), frames)
    kinds = seen.kinds()
    for kind in ("turn_started", "transcript_delta", "audio", "audio_done", "turn_ended"):
        assert kind in kinds
    audio = next(e for e in seen.events if e.type == "audio")
    assert audio.data == b"\x01\x00" * 2400
    item = [e for e in seen.events if e.type == "item_updated"][-1].item
    assert isinstance(item, AssistantMessageItem) and item.status == "incomplete"
    assert isinstance(item.content[0], AssistantAudio)
    assert item.content[0].transcript == "Hi there"


def test_an_item_cut_short_stays_incomplete() -> None:
    """What ``conversation.item.retrieved`` shows of a cancelled response's item."""
    item = ConversationItem("item_1", "assistant", [], status="in_progress")
    assert item.frame()["status"] == "in_progress"
    item.status = "incomplete"
    assert item.frame()["status"] == "incomplete"
    assert ConversationItem("item_2", "user", []).frame()["status"] == "completed"
