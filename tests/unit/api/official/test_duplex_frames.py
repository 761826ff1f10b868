"""Worker events -> the official ``/ws/duplex`` frames: one ``result`` per step."""

from __future__ import annotations

from api.official.duplex_frames import ResultMapper
from streaming.events import Created, Error, ErrorCode, Gap, Listen, Speak


def test_prepared_names_the_recording() -> None:
    frames = ResultMapper("rec1").frames(Created(prompt_length=40))
    assert frames == [{"type": "prepared", "prompt_length": 40, "recording_session_id": "rec1"}]
    assert ResultMapper(None).frames(Created(prompt_length=3)) == [
        {"type": "prepared", "prompt_length": 3}
    ]


def test_each_step_is_one_result_counted_in_current_time() -> None:
    m = ResultMapper(None)
    listen = m.frames(Listen(input_id="input_1", kv_cache_length=50, metrics={"step_s": 0.02}), 0.0)
    speak = m.frames(
        Speak(response_id="r", input_id="input_2", text="hi", audio="AAAA", end_of_turn=True)
    )
    assert [f["type"] for f in listen + speak] == ["result", "result"]
    assert listen[0]["is_listen"] is True and listen[0]["audio_data"] is None
    assert listen[0]["cost_all_ms"] == 20.0 and listen[0]["kv_cache_length"] == 50
    assert listen[0]["wall_clock_ms"] is not None
    assert speak[0]["is_listen"] is False and speak[0]["text"] == "hi"
    assert speak[0]["audio_data"] == "AAAA" and speak[0]["end_of_turn"] is True
    assert [listen[0]["current_time"], speak[0]["current_time"]] == [1, 2]
    assert speak[0]["wall_clock_ms"] is None  # the chunk's arrival is not known


def test_the_empty_closing_piece_of_a_cut_response_is_no_frame() -> None:
    cut = Speak(response_id="r", input_id="input_3", end_of_turn=True, interrupted=True)
    assert ResultMapper(None).frames(cut) == []


def test_errors_are_strings() -> None:
    m = ResultMapper(None)
    err = m.frames(Error(code=ErrorCode.INFERENCE_ERROR, message="step failed"))
    assert err == [{"type": "error", "error": "step failed"}]
    gap = m.frames(Gap(first=3, last=5))
    assert gap[0]["type"] == "error" and "3..5" in gap[0]["error"]
