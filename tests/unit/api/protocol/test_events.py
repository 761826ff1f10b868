"""api/protocol/events.py: every event type the spec names is an enum member, and every member is
the spec's or a listed extension.

The spec is the public protocol's documents (``OMNISERVE_TEST_SPEC_DIR``, default
``../shared/spec`` beside the checkout, where CI has it: 01-03 the current dialect, 04 the
older one, 05 ``/ws/chat``). A name is an event type where the spec writes it as one: a JSON
example's ``"type": "..."``, a dotted ``session.*`` / ``input.*`` / ``response.*`` /
``input_audio_buffer.*`` name, or a ``/ws/chat`` message type its examples switch on.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from api.protocol import events
from api.protocol.chat_validation import ContentItem
from api.protocol.errors import ErrorType
from api.protocol.events import (
    CURRENT_SERVER_EVENTS,
    EXTENSIONS,
    OLDER_CLIENT_EVENTS,
    OLDER_SERVER_EVENTS,
    ClientEvent,
    ContentType,
    LegacyChatEvent,
    ServerEvent,
)
from streaming.events import CloseReason, ErrorCode

ROOT = Path(__file__).resolve().parents[4]
SPEC_DIR = Path(os.environ.get("OMNISERVE_TEST_SPEC_DIR", ROOT.parent / "shared" / "spec"))

# Dotted words of the spec that are not event types.
NOT_EVENTS = {
    "input.video_frames": "a field path (spec/03)",
    # spec/01's "session.close and session.closed", run together when the page became text
    "session.closeandsession.closed": "two names, both found elsewhere",
}
# ``"reason"`` values of the spec that are no close reason of the server's.
NOT_CLOSE_REASONS = {
    "turn_done": "a client's own close reason (spec/02), echoed as is",
    "turn_end": "response.done's reason (spec/01, 02)",
}

TYPE_VALUE = re.compile(r'"type"\s*:\s*"([a-z_.]+)"')
DOTTED = re.compile(r"\b(?:session|input_audio_buffer|input|response)(?:\.[a-z_]+)+")
LEGACY_SWITCH = re.compile(r"""case '([a-z_]+)'|\["type"\] == "([a-z_]+)\"""")
REASON_VALUE = re.compile(r'"reason"\s*:\s*"([a-z_]+)"')
CODE_VALUE = re.compile(r'"code"\s*:\s*"([a-z_]+)"')
REASON_LIST = re.compile(r"reason may be ([a-z_, ]+?), or another")

pytestmark = pytest.mark.skipif(not SPEC_DIR.is_dir(), reason=f"no spec documents at {SPEC_DIR}")


def _spec(*numbers: str) -> str:
    return "\n".join(
        path.read_text() for n in numbers for path in sorted(SPEC_DIR.glob(f"{n}-*.txt"))
    )


def _names(text: str) -> set[str]:
    """Every event type a spec text names, with content-item types and error types."""
    found = set(TYPE_VALUE.findall(text)) | set(DOTTED.findall(text))
    for case, compared in LEGACY_SWITCH.findall(text):
        found.add(case or compared)
    return found - NOT_EVENTS.keys()


def _events(names: set[str]) -> set[str]:
    """``names`` less the content-item and error types (``ContentType``, ``ErrorType``)."""
    return names - set(ContentType) - set(ErrorType)


REALTIME = ClientEvent, ServerEvent
ALL_EVENTS = {str(m) for enum in (ClientEvent, ServerEvent, LegacyChatEvent) for m in enum}


def test_the_spec_documents_are_there() -> None:
    assert len(list(SPEC_DIR.glob("0[1-5]-*.txt"))) == 5


def test_every_event_type_in_the_spec_is_named() -> None:
    names = _events(_names(_spec("01", "02", "03", "04", "05")))
    assert names, "no event types found: the spec's format changed"
    missing = names - ALL_EVENTS
    assert not missing, f"event types of the spec that events.py does not name: {sorted(missing)}"


def test_every_named_event_is_the_specs_or_a_listed_extension() -> None:
    spec = _events(_names(_spec("01", "02", "03", "04", "05")))
    unlisted = ALL_EVENTS - spec - EXTENSIONS
    assert not unlisted, f"neither in the spec nor in EXTENSIONS: {sorted(unlisted)}"
    assert not (EXTENSIONS & spec), "an extension the spec names after all"


def test_content_and_error_types_are_the_specs() -> None:
    names = _names(_spec("01", "02", "03", "04", "05"))
    assert names & set(ContentType) == set(ContentType)
    assert names & set(ErrorType) == set(ErrorType)


def test_each_dialect_uses_the_names_of_its_documents() -> None:
    current, older = _events(_names(_spec("01", "02", "03"))), _events(_names(_spec("04")))
    for names, server_events in ((current, CURRENT_SERVER_EVENTS), (older, OLDER_SERVER_EVENTS)):
        ours = names & set(ServerEvent)
        assert ours <= server_events, sorted(ours - server_events)
        assert names - set(ServerEvent) <= set(ClientEvent)
    # the older dialect's first events are spec/04's only: they choose the dialect
    assert older >= OLDER_CLIENT_EVENTS
    assert not (current & OLDER_CLIENT_EVENTS)
    assert (set(ServerEvent) - EXTENSIONS) - (current | older) == set()


def test_legacy_chat_events_are_spec_05s() -> None:
    legacy = _events(_names(_spec("05")))
    assert set(LegacyChatEvent) <= legacy
    assert legacy <= set(LegacyChatEvent) | set(ServerEvent)


def test_close_reasons_and_error_codes_of_the_spec_are_known() -> None:
    text = _spec("01", "02", "03", "04", "05")
    reasons = set(REASON_VALUE.findall(text))
    for listed in REASON_LIST.findall(text):
        reasons |= {r.strip() for r in listed.split(",") if r.strip()}
    assert reasons, "no close reasons found: the spec's format changed"
    unknown = reasons - set(CloseReason) - NOT_CLOSE_REASONS.keys()
    assert not unknown, f"close reasons of the spec that CloseReason does not name: {unknown}"
    codes = set(CODE_VALUE.findall(text))
    assert codes and codes <= set(ErrorCode)


def test_chat_content_items_take_the_content_types() -> None:
    assert ContentItem.model_fields["type"].annotation is ContentType
    item = ContentItem.model_validate({"type": "image", "data": "x"})
    assert item.type is ContentType.IMAGE and item.model_dump()["type"] == "image"


def test_every_protocol_name_is_defined_once() -> None:
    """Within an endpoint's direction no value repeats; across them only ``error`` does (every
    dialect calls its error frame that)."""
    seen: dict[str, str] = {}
    for enum in (ClientEvent, ServerEvent, LegacyChatEvent):
        for member in enum:
            where = seen.setdefault(member.value, enum.__name__)
            assert where == enum.__name__ or member.value == "error", (member, where)
    assert set(events.__all__) >= {"ClientEvent", "ServerEvent", "LegacyChatEvent", "EXTENSIONS"}
