"""Every frame of the official gateway's ``/ws/duplex``: worker events as its worker's protocol
has them, and the session's own (queue, pause, stop). Its type names are ``OfficialEvent``.

The official worker answers ``prepare`` with ``prepared {prompt_length}`` and each
``audio_chunk`` with one ``result`` (its ``DuplexGenerateResult``: ``is_listen``, ``text``,
``audio_data`` base64 float32 PCM at 24 kHz, ``end_of_turn``, ``current_time``, the ``cost_*_ms``
timings, ``kv_cache_length``, ``wall_clock_ms``, ``server_send_ts``); errors are
``{"type": "error", "error": "<message>"}``. A session asks its worker for whole steps
(``InitControl.whole_steps``), so each model step is one ``Listen`` or one ``Speak`` event and
becomes one ``result``. The empty closing piece of a response the model cut short is no frame:
the next ``result`` (``is_listen``) ends the turn for the client, as the official one does.
"""

from __future__ import annotations

import time
from typing import Any

from api.protocol.errors import Frame
from api.protocol.events import OFFICIAL_QUEUE_EVENTS, OfficialEvent
from streaming.events import Created, Error, Event, Gap, Listen, Speak


def official_error(message: str) -> Frame:
    """The official dialect's error frame (a string)."""
    return {"type": OfficialEvent.ERROR, "error": message}


def official_frame(event: OfficialEvent) -> Frame:
    """A frame that is its type alone (``queue_done``, ``resumed``, ``interrupted``,
    ``stopped``)."""
    return {"type": event}


def official_paused(timeout: float) -> Frame:
    """``paused``: the answer to ``pause``, with the seconds the session waits for a resume."""
    return {"type": OfficialEvent.PAUSED, "timeout": timeout}


def official_timeout(reason: str) -> Frame:
    """``timeout``: the session ended at its duration limit, or paused for too long."""
    return {"type": OfficialEvent.TIMEOUT, "reason": reason}


def official_queue_frame(frame: Frame) -> Frame | None:
    """The queue's ``session.queued`` / ``session.queue_update`` under the official names
    (``queued``, ``queue_update``); None for any other frame."""
    kind = OFFICIAL_QUEUE_EVENTS.get(frame["type"])
    if kind is None:
        return None
    out: Frame = {
        "type": kind,
        "position": frame.get("position"),
        "estimated_wait_s": frame.get("estimated_wait_s"),
        "queue_length": frame.get("queue_length"),
    }
    if kind is OfficialEvent.QUEUED:
        out["ticket_id"] = frame.get("ticket_id")
    return out


def _ms(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return round(float(value) * 1000, 1) if isinstance(value, int | float) else None


def _int(metrics: dict[str, Any], key: str) -> int | None:
    value = metrics.get(key)
    return int(value) if isinstance(value, int | float) else None


class ResultMapper:
    """One session's events, as its official client expects them."""

    def __init__(self, recording_id: str | None) -> None:
        self.recording_id = recording_id
        self.steps = 0  # results sent: the official ``current_time`` (one per step)
        self.kv_cache_length = 0

    def frames(self, ev: Event, received_at: float | None = None) -> list[Frame]:
        """Frames for one event; ``received_at`` (monotonic): when the gateway got the chunk
        the step answers (``wall_clock_ms``)."""
        match ev:
            case Created():
                self.kv_cache_length = ev.prompt_length
                frame: Frame = {"type": OfficialEvent.PREPARED, "prompt_length": ev.prompt_length}
                if self.recording_id:
                    frame["recording_session_id"] = self.recording_id
                return [frame]
            case Listen():
                self.kv_cache_length = ev.kv_cache_length or self.kv_cache_length
                return [self._result(True, "", None, False, ev.metrics, received_at)]
            case Speak() if ev.interrupted and not ev.audio and not ev.text:
                return []
            case Speak():
                if ev.kv_cache_length is not None:
                    self.kv_cache_length = ev.kv_cache_length
                audio = ev.audio or None
                return [
                    self._result(False, ev.text, audio, ev.end_of_turn, ev.metrics, received_at)
                ]
            case Error():
                return [official_error(ev.message or ev.code.value)]
            case Gap():
                return [official_error(f"output events {ev.first}..{ev.last} were lost")]
            case _:
                return []

    def _result(
        self,
        listen: bool,
        text: str,
        audio: str | None,
        end_of_turn: bool,
        metrics: dict[str, Any],
        received_at: float | None,
    ) -> Frame:
        self.steps += 1
        wall = (time.monotonic() - received_at) * 1000 if received_at is not None else None
        return {
            "type": OfficialEvent.RESULT,
            "is_listen": listen,
            "text": text,
            "audio_data": audio,
            "end_of_turn": end_of_turn,
            "current_time": self.steps,
            "cost_llm_ms": _ms(metrics, "llm_s"),
            "cost_tts_prep_ms": None,
            "cost_tts_ms": _ms(metrics, "tts_s"),
            "cost_token2wav_ms": _ms(metrics, "token2wav_s"),
            "cost_all_ms": _ms(metrics, "step_s"),
            "n_tokens": _int(metrics, "n_tokens"),
            "n_tts_tokens": _int(metrics, "n_tts_tokens"),
            "server_send_ts": time.time(),
            "wall_clock_ms": round(wall, 1) if wall is not None else None,
            "kv_cache_length": self.kv_cache_length,
            "vision_slices": _int(metrics, "vision_slices") or 0,
            "vision_tokens": _int(metrics, "vision_tokens") or 0,
        }
