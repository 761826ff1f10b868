"""Internal worker events -> client frames, in the dialect the client chose.

- ``current``: session.init / input.append / response.output.delta {kind} (spec/01-03);
- ``older``: session.update / input_audio_buffer.append / response.output_audio.delta and
  response.listen (spec/04).
"""

from __future__ import annotations

from typing import Any, Literal

from api.errors import OUTPUT_GAP, error_frame

Dialect = Literal["current", "older"]

OLDER_EVENTS = {"session.update", "input_audio_buffer.append"}


def dialect_of(event_type: str) -> Dialect:
    """The dialect a client's first event implies."""
    return "older" if event_type in OLDER_EVENTS else "current"


class DuplexMapper:
    """Maps one duplex session's internal events for its client."""

    def __init__(self, dialect: Dialect, session_id: str) -> None:
        self.dialect = dialect
        self.session_id = session_id
        self.kv_cache_length = 0

    def created(self, ev: dict[str, Any]) -> list[dict[str, Any]]:
        metrics = ev.get("metrics") or {}
        self.kv_cache_length = int(ev.get("prompt_length") or 0)
        frame: dict[str, Any] = {"type": "session.created", "session_id": self.session_id}
        if self.dialect == "current":
            frame["mode"] = "full_duplex"
            frame["metrics"] = metrics
        frame["prompt_length"] = int(ev.get("prompt_length") or 0)
        return [frame]

    def listen(self, ev: dict[str, Any]) -> list[dict[str, Any]]:
        self.kv_cache_length = int(ev.get("kv_cache_length") or self.kv_cache_length)
        if self.dialect == "older":
            return [{"type": "response.listen", "kv_cache_length": self.kv_cache_length}]
        return [
            {
                "type": "response.output.delta",
                "kind": "listen",
                "session_id": self.session_id,
                "input_id": ev.get("input_id"),
                "text": "",
                "metrics": ev.get("metrics") or {},
            }
        ]

    def speak(self, ev: dict[str, Any]) -> list[dict[str, Any]]:
        if ev.get("kv_cache_length") is not None:
            self.kv_cache_length = int(ev["kv_cache_length"])
        text, audio = ev.get("text") or "", ev.get("audio") or ""
        if self.dialect == "older":
            return [
                {
                    "type": "response.output_audio.delta",
                    "text": text,
                    "audio": audio,
                    "end_of_turn": bool(ev.get("end_of_turn")),
                    "kv_cache_length": self.kv_cache_length,
                }
            ]
        base = {
            "type": "response.output.delta",
            "session_id": self.session_id,
            "response_id": ev.get("response_id"),
            "input_id": ev.get("input_id"),
        }
        metrics = dict(ev.get("metrics") or {})
        metrics["end_of_turn"] = bool(ev.get("end_of_turn"))
        frames = []
        if text:
            frames.append({**base, "kind": "text", "text": text, "metrics": metrics})
        if audio:
            frames.append({**base, "kind": "audio", "audio": audio, "metrics": metrics})
        return frames

    def map(self, ev: dict[str, Any]) -> list[dict[str, Any]]:
        """Frames for one internal event (closing events are handled by the caller)."""
        kind = ev.get("type")
        if kind == "created":
            return self.created(ev)
        if kind == "listen":
            return self.listen(ev)
        if kind == "speak":
            return self.speak(ev)
        if kind == "error":
            return [
                error_frame(
                    ev.get("code") or "inference_error", ev.get("message") or "", ev.get("field")
                )
            ]
        if kind == "gap":
            return [gap_frame(ev)]
        return []


def gap_frame(ev: dict[str, Any]) -> dict[str, Any]:
    """Output the replay log no longer holds is reported, never skipped silently."""
    return error_frame(
        OUTPUT_GAP, f"output events {ev['first']}..{ev['last']} were lost and cannot be replayed"
    )
