"""An OpenAI connection's recording, in the recorder's own terms.

The recorder (``api/recordings``) knows the MiniCPM-o frames: float32 audio in ``input.append``
and ``response.output.delta``, text in ``response.output.delta`` and ``response.done``. An
OpenAI connection's audio is pcm16 at 24 kHz, so its audio is recorded where the session holds
it in the model's format already (what the model heard, what it said: no decode added on the
event loop), and its text events are renamed; every other event is recorded as it is.
"""

from __future__ import annotations

from typing import Any

from api.recordings.recorder import SessionRecording

TEXT_DELTAS = frozenset({"response.output_audio_transcript.delta", "response.output_text.delta"})


class OpenAIRecording(SessionRecording):
    """Wraps the connection's ``SessionRecording``."""

    __slots__ = ("inner",)

    def __init__(self, inner: SessionRecording) -> None:
        super().__init__(inner.id)
        self.inner = inner

    def client_event(self, event: dict[str, Any]) -> None:
        if self.id is not None and event.get("type") != "input_audio_buffer.append":
            self.inner.client_event(event)  # (its audio: ``audio_in``)

    def audio_in(self, audio_b64: str) -> None:
        """Input as the model gets it (float32 16 kHz base64)."""
        if self.id is not None:
            self.inner.client_event({"type": "input.append", "input": {"audio": audio_b64}})

    def chat_request(self, request: dict[str, Any]) -> None:
        """A chat turn's request (the conversation it answers), as chat mode records it."""
        if self.id is not None:
            self.inner.client_event({"type": "input.append", "input": request})

    def audio_out(self, response_id: str, audio_b64: str) -> None:
        """Speech as the model gave it (float32 24 kHz base64)."""
        if self.id is not None:
            self.inner.sent(
                {
                    "type": "response.output.delta",
                    "kind": "audio",
                    "response_id": response_id,
                    "audio": audio_b64,
                }
            )

    def sent(self, frame: dict[str, Any]) -> None:
        if self.id is None:
            return
        kind = frame.get("type")
        if kind == "response.output_audio.delta":
            return  # (recorded by ``audio_out``)
        if kind in TEXT_DELTAS:
            frame = {
                "type": "response.output.delta",
                "kind": "text",
                "response_id": frame.get("response_id"),
                "text": frame.get("delta", ""),
            }
        elif kind == "response.done":
            response = frame.get("response") or {}
            texts = [
                str(c.get("transcript") or c.get("text") or "")
                for item in response.get("output") or []
                for c in item.get("content") or []
            ]
            frame = {
                "type": "response.done",
                "response_id": response.get("id"),
                "text": "".join(texts),
            }
        self.inner.sent(frame)

    def admitted(self, slot_id: str) -> None:
        self.inner.admitted(slot_id)

    def finish(self, **info: Any) -> None:
        self.inner.finish(**info)
