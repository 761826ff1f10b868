"""streaming/events.py: every event survives the trip worker -> Redis bytes -> gateway."""

from __future__ import annotations

import typing

import numpy as np
import orjson
import pybase64
import pytest

from streaming import events as E

SAMPLES: list[E.Event] = [
    E.Started(worker_id="w#1", backend="scripted"),
    E.Created(prompt_length=12, metrics={"backend": "scripted"}),
    E.Created(prompt_length=30, metrics={"history_turns": 2}, recovered=True),
    E.Recovering(reason="worker_lost"),
    E.Listen(input_id="input_1", kv_cache_length=40, metrics={"step_s": 0.1}),
    E.Rollover(kv_cache_length=310, metrics={"rollovers": 1}),
    E.Expiring(reason=E.ExpiringReason.DURATION, time_left_ms=30_000),
    E.Speak(response_id="resp_1", input_id="input_2", text="Hi", audio="AAAA", end_of_turn=True),
    E.Speak(response_id="resp_1", input_id="input_2", interrupted=True),
    E.Prefill(input_tokens=7, prefill_s=0.01),
    E.TextDelta(text="Hello"),
    E.AudioDelta(audio="AAAA"),
    E.Done(text="Hello", input_tokens=7, generated_tokens=1, last_audio="AAAA"),
    E.Error(code=E.ErrorCode.INVALID_PAYLOAD, message="bad", field="payload", input_id="i"),
    E.Closed(reason=E.CloseReason.CONTEXT_FULL),
    E.Closed(reason="turn_done"),  # a client's own reason is echoed
    E.TurnEnd(),
    E.Gap(first=3, last=5),
]


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_round_trip(event: E.Event) -> None:
    event.seq, event.emitted_at = 9, 1.5
    assert E.decode_event(E.encode_event(event)) == event


def test_every_event_class_is_in_the_union_with_its_own_tag() -> None:
    union = typing.get_args(typing.get_args(E.Event)[0])
    tags = [E.tag(cls) for cls in union]
    assert len(set(tags)) == len(tags) == 15
    assert {type(e) for e in SAMPLES} == set(union)


def test_wire_form_is_plain_json_with_the_type_tag() -> None:
    wire = orjson.loads(E.encode_event(E.Listen(input_id="input_1", kv_cache_length=3, seq=4)))
    assert wire["type"] == "listen" and wire["seq"] == 4 and wire["input_id"] == "input_1"


def test_numpy_metrics_are_encoded() -> None:
    ev = E.Listen(input_id="i", kv_cache_length=1, metrics={"x": np.float32(0.5)})
    assert E.decode_event(E.encode_event(ev)).metrics == {"x": 0.5}


@pytest.mark.parametrize(
    "data",
    [
        b'{"type": "telepathy"}',
        b'{"type": "listen"}',  # required fields missing
        b'{"type": "error", "code": "no_such_code", "message": "x"}',
        b"[1, 2]",
        b"not json",
    ],
)
def test_what_is_not_an_event_is_refused(data: bytes) -> None:
    with pytest.raises(E.BadEvent):
        E.decode_event(data)


def test_error_codes_know_their_side() -> None:
    client = {c for c in E.ErrorCode if c.is_client_error}
    assert client == {
        "not_ready",
        "unknown_event",
        "missing_field",
        "invalid_payload",
        "unauthorized",
        "origin_not_allowed",
        "too_many_connections",
        "turn_queue_full",
        "session_not_found",
        "resume_expired",
        "quota_exceeded",
    }
    assert not E.ErrorCode.OUTPUT_GAP.is_client_error


def test_final_events() -> None:
    assert isinstance(E.TurnEnd(), E.FINAL_EVENTS)
    assert isinstance(E.Closed(reason="x"), E.FINAL_EVENTS)
    assert not isinstance(E.Done(text=""), E.FINAL_EVENTS)


def test_usage_figures_travel_typed() -> None:
    """The worker's usage figures (compute time, tokens) survive the trip to the gateway."""
    speak = E.Speak(response_id="r", input_id="i", text="hi there", worker_s=0.25, text_tokens=2)
    back = E.decode_event(E.encode_event(speak))
    assert isinstance(back, E.Speak) and (back.worker_s, back.text_tokens) == (0.25, 2)
    done = E.decode_event(E.encode_event(E.Done(text="x", worker_s=1.5)))
    assert isinstance(done, E.Done) and done.worker_s == 1.5
    listen = E.decode_event(b'{"type": "listen", "input_id": "i", "kv_cache_length": 3}')
    assert isinstance(listen, E.Listen) and listen.worker_s == 0.0  # an older worker's event


def test_audio_crosses_redis_as_raw_bytes() -> None:
    pcm = np.linspace(-1, 1, 24000, dtype=np.float32).tobytes()
    b64 = pybase64.b64encode(pcm).decode()
    for ev in (
        E.Speak(response_id="r", input_id="i", text="a\nb", audio=b64),
        E.AudioDelta(audio=b64),
        E.Done(text="x", audio=b64, last_audio="AAAA"),
        E.Done(text="x", last_audio=b64),
    ):
        data = E.encode_event(ev)
        assert len(data) < len(b64)  # raw: a quarter fewer bytes than the base64
        assert pcm in data
        assert orjson.loads(E.event_head(data))["type"] == ev.type
        assert E.decode_event(data) == ev


def test_audio_that_is_not_canonical_base64_stays_in_the_json() -> None:
    ev = E.Speak(response_id="r", input_id="i", audio="QR==")  # decodes, re-encodes as QQ==
    data = E.encode_event(ev)
    assert E.event_head(data) == data
    assert E.decode_event(data) == ev


@pytest.mark.parametrize(
    "tail",
    [b"\n", b"\n\0\0\0\x05abc", b"\n\0\0\0\x01ab", b"\n\0\0"],
    ids=["empty", "truncated", "stray bytes", "short length"],
)
def test_a_bad_raw_tail_is_a_bad_event(tail: bytes) -> None:
    head = E.encode_event(E.Speak(response_id="r", input_id="i"))
    with pytest.raises(E.BadEvent):
        E.decode_event(head + tail)
    with pytest.raises(E.BadEvent):  # an event class without audio has no tail
        E.decode_event(E.encode_event(E.Listen(input_id="i", kv_cache_length=1)) + b"\n")
