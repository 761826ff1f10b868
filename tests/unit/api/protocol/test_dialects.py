"""api/protocol/dialects.py: worker events -> client frames for every endpoint and dialect."""

from __future__ import annotations

import pytest

from api.protocol.dialects import (
    ChatMapper,
    Dialect,
    DuplexMapper,
    LegacyChatMapper,
    dialect_of,
    older_close_reason,
)
from streaming.events import (
    AudioDelta,
    Closed,
    Created,
    Done,
    Error,
    ErrorCode,
    Event,
    Expiring,
    ExpiringReason,
    Gap,
    Listen,
    Prefill,
    Rollover,
    Speak,
    Started,
    TextDelta,
    TurnEnd,
)

GAP = Gap(first=4, last=6)
GAP_MESSAGE = "output events 4..6 were lost and cannot be replayed"


def test_dialect_of_the_first_event() -> None:
    assert dialect_of("session.update") is Dialect.OLDER
    assert dialect_of("input_audio_buffer.append") is Dialect.OLDER
    assert dialect_of("session.init") is Dialect.CURRENT
    assert dialect_of("anything.else") is Dialect.CURRENT


def test_duplex_current() -> None:
    m = DuplexMapper(Dialect.CURRENT, "rt_1")
    assert m.frames(Created(prompt_length=9, metrics={"backend": "x"})) == [
        {
            "type": "session.created",
            "session_id": "rt_1",
            "mode": "full_duplex",
            "metrics": {"backend": "x"},
            "prompt_length": 9,
        }
    ]
    assert m.frames(Listen(input_id="input_1", kv_cache_length=12, metrics={"a": 1})) == [
        {
            "type": "response.output.delta",
            "kind": "listen",
            "session_id": "rt_1",
            "input_id": "input_1",
            "text": "",
            "metrics": {"a": 1},
        }
    ]
    text, audio = m.frames(
        Speak(response_id="r", input_id="input_2", text="Hi", audio="QQ==", metrics={"b": 2})
    )
    assert text["kind"] == "text" and text["text"] == "Hi" and text["response_id"] == "r"
    assert audio["kind"] == "audio" and audio["audio"] == "QQ=="
    assert text["metrics"] == audio["metrics"] == {"b": 2, "end_of_turn": False}
    # the closing piece of an interrupted response: its audio, marked; with nothing left, no frame
    (closing,) = m.frames(
        Speak(response_id="r", input_id="input_2", audio="QQ==", end_of_turn=True, interrupted=True)
    )
    assert closing["input_id"] == "input_2"
    assert closing["metrics"] == {"end_of_turn": True, "interrupted": True}
    assert m.frames(Speak(response_id="r", input_id="input_2", end_of_turn=True)) == []


def test_duplex_older() -> None:
    m = DuplexMapper(Dialect.OLDER, "rt_1")
    assert m.frames(Created(prompt_length=9)) == [
        {"type": "session.created", "session_id": "rt_1", "prompt_length": 9}
    ]
    assert m.frames(Listen(input_id="input_1", kv_cache_length=12)) == [
        {"type": "response.listen", "kv_cache_length": 12}
    ]
    # kv_cache_length carries over from the last step when a piece has none
    assert m.frames(Speak(response_id="r", input_id="input_2", end_of_turn=True)) == [
        {
            "type": "response.output_audio.delta",
            "text": "",
            "audio": "",
            "end_of_turn": True,
            "kv_cache_length": 12,
        }
    ]


@pytest.mark.parametrize("dialect", list(Dialect))
def test_duplex_errors_and_gaps(dialect: Dialect) -> None:
    m = DuplexMapper(dialect, "rt_1")
    err = Error(code=ErrorCode.INVALID_PAYLOAD, message="bad", field="payload.config")
    assert m.frames(err) == [
        {
            "type": "error",
            "error": {
                "code": "invalid_payload",
                "message": "bad",
                "type": "client_error",
                "field": "payload.config",
            },
        }
    ]
    assert m.frames(GAP) == [
        {
            "type": "error",
            "error": {"code": "output_gap", "message": GAP_MESSAGE, "type": "server_error"},
        }
    ]
    for relay_only in (Started(worker_id="w"), Closed(reason="timeout"), TurnEnd()):
        assert m.frames(relay_only) == []


def test_chat_turn() -> None:
    m = ChatMapper("rt_1", "resp_1", "input_4")
    base = {"session_id": "rt_1", "response_id": "resp_1"}
    delta = {"type": "response.output.delta", **base, "input_id": "input_4", "metrics": {}}
    assert m.frames(Prefill(input_tokens=3)) == []
    assert m.frames(TextDelta(text="a")) == [{**delta, "kind": "text", "text": "a"}]
    assert m.frames(AudioDelta(audio="QQ==")) == [{**delta, "kind": "audio", "audio": "QQ=="}]
    last, done = m.frames(Done(text="a", last_audio="Qg==", metrics={"total_s": 1}))
    assert last == {**delta, "kind": "audio", "audio": "Qg=="}
    assert done == {
        "type": "response.done",
        **base,
        "text": "a",
        "reason": "turn_end",
        "metrics": {"total_s": 1},
    }
    (whole,) = m.frames(Done(text="a", audio="QUFB"))  # non-streaming: all the speech at once
    assert whole["audio"] == "QUFB"
    assert m.frames(GAP)[0]["error"]["code"] == "output_gap"
    err = m.frames(Error(code=ErrorCode.INFERENCE_ERROR, message="boom"))[0]
    assert err["error"] == {"code": "inference_error", "message": "boom", "type": "server_error"}


def test_legacy_chat() -> None:
    m = LegacyChatMapper("chat_1")
    assert m.frames(Prefill(input_tokens=3)) == [{"type": "prefill_done", "input_tokens": 3}]
    assert m.frames(TextDelta(text="a")) == [
        {"type": "chunk", "text_delta": "a", "audio_data": None}
    ]
    assert m.frames(AudioDelta(audio="QQ==")) == [
        {"type": "chunk", "text_delta": "", "audio_data": "QQ=="}
    ]
    assert m.frames(Done(text="a", input_tokens=3, generated_tokens=1)) == [
        {
            "type": "done",
            "text": "a",
            "generated_tokens": 1,
            "input_tokens": 3,
            "audio_data": None,
            "recording_session_id": "chat_1",
        }
    ]
    # streaming: the final segment is the last chunk (players that stream chunks get all the
    # speech) and nothing is left over for done (a client appending it appends nothing)
    last_chunk, done = m.frames(Done(text="a", last_audio="Qg=="))
    assert last_chunk == {"type": "chunk", "text_delta": "", "audio_data": "Qg=="}
    assert done["type"] == "done" and done["audio_data"] is None
    # non-streaming: the whole speech in done only
    assert [f["type"] for f in m.frames(Done(text="a", audio="Qw=="))] == ["done"]


@pytest.mark.parametrize(
    "event,message",
    [
        (GAP, f"output_gap: {GAP_MESSAGE}"),  # lost output ends the request, reported
        (Error(code=ErrorCode.INFERENCE_ERROR, message="boom"), "boom"),
        (Error(code=ErrorCode.INFERENCE_ERROR, message=""), "inference_error"),
        (Closed(reason="server_shutdown"), "generation ended without a result"),
    ],
)
def test_legacy_chat_failures_end_the_request(event: Event, message: str) -> None:
    m = LegacyChatMapper("chat_1")
    (frame,) = m.frames(event)
    assert frame == {"type": "error", "error": message}
    assert frame["type"] in m.ENDING


def test_older_close_reasons_are_spec04s() -> None:
    assert older_close_reason("user_stop", "user_stop") == "stopped"
    assert older_close_reason("bye", "bye") == "stopped"  # the client's own reason, confirmed
    assert older_close_reason("backend_error", "user_stop") == "error"
    for kept in ("timeout", "context_full", "server_shutdown", "error"):
        assert older_close_reason(kept, "user_stop") == kept


def test_duplex_rollover_and_expiring_frames() -> None:
    m = DuplexMapper(Dialect.CURRENT, "rt_1")
    m.frames(Listen(input_id="input_1", kv_cache_length=6200))
    rollover = Rollover(kv_cache_length=300, metrics={"rollovers": 1})
    assert m.frames(rollover) == [
        {
            "type": "session.rollover",
            "session_id": "rt_1",
            "kv_cache_length": 300,
            "metrics": {"rollovers": 1},
        }
    ]
    expiring = Expiring(reason=ExpiringReason.DURATION, time_left_ms=30_000)
    assert m.frames(expiring) == [
        {
            "type": "session.expiring",
            "session_id": "rt_1",
            "reason": "duration",
            "time_left_ms": 30_000,
        }
    ]
    # the older dialect has no extension event for a rollover: its kv_cache_length drops
    old = DuplexMapper(Dialect.OLDER, "rt_2")
    old.frames(Listen(input_id="input_1", kv_cache_length=6200))
    assert old.frames(rollover) == []
    assert old.frames(Listen(input_id="input_2", kv_cache_length=0)) == [
        {"type": "response.listen", "kv_cache_length": 300}
    ]
